"""rocewatch's side of Kafka, one job per module: ``topics`` (creation, limits), ``publish``
(producers, the telemetry publisher), ``intake`` (telemetry records read in, dead letters),
``poll`` (consumer-group polling around kafka-python's bugs), ``state_store`` (state records),
``transactions`` (the detect stage's fenced writes), ``delivery`` (alerts and actions sent
exactly once), ``preflight`` (TLS and SASL checked before a client starts)."""
