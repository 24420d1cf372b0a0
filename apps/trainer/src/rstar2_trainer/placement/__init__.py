"""Placement: where a run's engines, training ranks, tool and grading services live, and how
the weights move between them.

`local` builds them on this machine (engines in-process, sandbox and verify servers as loopback
children), `remote` drives `rstar2-rollout serve` workers on other machines, and `cluster`
places engines, servers and training ranks (`ranks`) on a Ray cluster (`cluster_check`
validates one before a run starts). `weights` is the seam every placement shares: one
`WeightMover` per placement that sleeps the engines, moves the colocated training state and
pushes the policy's weights (`channel` is split placement's); `engines` keeps which engines are
alive. `servers` starts and authenticates the child services; `engine_actor` is the Ray actor
around an rstar2-rollout engine and `ray_engine` the driver's face of it; `config` holds the
schemas of the recipe's `cluster:` and `remote:` sections. The loop sees only a
`TrajectorySource` (`rstar2_rollout.collect`), the services' clients and the mover.
"""
