"""Placement: where a run's engines, tool and grading services live.

`local` builds them on this machine (engines in-process, sandbox and verify servers as loopback
children), `remote` drives `rstar2-rollout serve` workers on other machines, and `cluster`
places engines, servers and training ranks on a Ray cluster (`cluster_check` validates one
before a run starts). `servers` starts and authenticates the child services; `engine_actor`
is the Ray actor around an rstar2-rollout engine; `config` holds the schemas of the recipe's
`cluster:` and `remote:` sections. The loop sees only a `TrajectorySource`
(`rstar2_rollout.collect`) and the services' clients.
"""
