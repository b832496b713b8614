"""The detector runtime (`rocewatch detect`) over Kafka consumer groups: two stages in every
instance. One instance is a group of one; more split the work.

Stage 1, *aggregate* (group ``<group_id>-agg`` on the telemetry topic): one window engine per
assigned telemetry partition (rates, pending samples, steps), closed by that partition's own
watermark (its newest sample time less the allowed lateness). A partition's steps therefore
depend only on its own records, whichever instance runs it. Closed steps go to the steps topic
(a partition per fabric domain, key = telemetry partition): a small JSON header and the
aggregated rows as compressed Arrow IPC. After the step messages are flushed, the partition's
engine and next offset are written to the compacted state topic (state partition = telemetry
partition), and only then are the offsets committed. A partition (re)assigned to an instance
resumes from its latest state; steps it emits again after a crash are the same and stage 2
drops them.

Stage 2, *detect* (group ``<group_id>-detect`` on the steps topic, one partition per fabric
domain, so exactly one instance is active per domain and another takes over when it dies; see
:class:`DomainRoutes` for what a domain's steps hold): assembles every step from all telemetry
partitions (merged in partition order, so the result does not depend on who sent what when),
evaluates a step once every live partition has closed past it, runs the detectors, alert
lifecycle and policy, and publishes alerts and actions. Its state (the pipeline, per-partition
progress, partial steps, the steps-topic offset, the output topics' end offsets) is checkpointed
to the last partition of the state topic; after a takeover, events already published after that
checkpoint are read back and not sent again.
With ``kafka.fence_detect`` those writes are Kafka transactions (:class:`DetectWriter`), so an
instance that stalled past its session and lost the stage can write nothing more, and a fence
before each drain or resume keeps it off the scheduler too (:class:`FencedExecutor`).

A partition is left out of the stage-2 watermark while its owner reports it idle (caught up, no
records for ``idle_flush_s``, and no stalled input in this instance for ``partition_idle_s``:
after a broker outage, read to the end is not the end until publishers have had time to resend)
and the broker holds no record past the owner's read offset in the report (a report read back
after a takeover, or one a busy owner has not yet replaced, stops counting the moment a record
arrives), or when nobody has reported it for ``stall_s`` (no owner: longer than a failover takes,
so a failover does not drop a partition's steps).

Modules, in the order of the flow: ``aggregate`` (stage 1), ``steps`` (what passes between the
stages), ``detect`` (stage 2), ``service`` (both in one process), ``checkpoint`` (the state
format), ``timing`` and ``memory`` (the process's tuning). Their Kafka side is ``rocewatch.bus``.
"""
