"""Detectors: counters -> rates -> windows -> rules and models -> findings -> alerts."""
