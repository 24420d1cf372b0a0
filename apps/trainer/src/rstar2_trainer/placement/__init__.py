"""Placement: where a run's engines, training ranks, tool and grading services live, and how
the weights move between them.

`local` builds them on this machine (engines in-process, sandbox and verify servers as loopback
children), `remote` drives `rstar2-rollout serve` workers on other machines, and `cluster`
places engines, servers and training ranks (`ranks`) on a Ray cluster (`cluster_check`
validates one before a run starts). `weights` is the seam every placement shares: one
`WeightMover` per placement that sleeps the engines, moves the colocated training state and
pushes the policy's weights (`channel` is split placement's); `engines` keeps which engines are
alive. `servers` starts and authenticates the child services; `engine_actor` is the Ray actor
around an rstar2-rollout engine and `ray_engine` the driver's face of it. The schemas of the
recipe's `cluster:` and `remote:` sections are `rstar2_trainer.config.cluster`'s.

Every placement hands the loop one `local.Parts`: the `TrajectorySource` it collects from
(`rstar2_rollout.collect`), the `Engines` (alive, asleep), the `Scorer`, the `WeightMover`, the
tokenizer and model folder, the driver's model or the ranks' `TrainGroup`, and the child
services' health and counts (`check_servers`, `service_counts`).
"""
