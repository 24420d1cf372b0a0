"""Research code of rstar2-rollout: the scheduling policies that lost, and the simulator.

Nothing on the main surface imports this package: `import rstar2_rollout` loads neither the
simulator nor these policies. `scheduler.make_admission` imports `policies` when a
`SchedulerConfig` names a research policy (every kind stays in the config union, so recipes,
`rstar2-rollout serve --policy` and the benches accept them all). What is here:

- `kvprogress`, `kvgate`, `kvbound`: kv_progress, the paper's no-preemption promise kept turn by
  turn on the exact worst case;
- `forecast`: a central queue with admission on a Kaplan-Meier forecast of KV use;
- `peers`: the other frameworks' dispatch (static, power_of_two, cache_aware, least_tokens);
- `simengine`, `simulate`: a model of vLLM V1's scheduler on a virtual clock, and one simulated
  RL step of agentic rollouts through the real `Scheduler` (used by bench/rollout_sched.py and
  bench/calibrate_engine.py);
- `asyncsim`: several RL steps on that simulator with a trainer beside the engines: today's
  synchronous steps against bounded-staleness asynchronous ones with partial rollouts (used by
  bench/rollout_async.py).

Why they lost, with the numbers: SCHEDULER.md "Results".
"""
