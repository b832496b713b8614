"""rocewatch's side of Kafka, one job per module: ``config`` (the ``kafka`` section), ``topics``
(creation, limits), ``publish`` (producers, the telemetry publisher), ``poll`` (consumer-group
polling around kafka-python's bugs), ``state_store`` (state records) and ``signing`` (their
MAC), ``transactions`` (the detect stage's fenced writes), ``preflight`` (TLS and SASL checked
before a client starts). It knows Kafka, not detection: what goes through it is the runtime's
(rocewatch/runtime: intake, delivery)."""
