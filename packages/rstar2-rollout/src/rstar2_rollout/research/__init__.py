"""Research code of rstar2-rollout: the scheduling policies that lost, and the simulator.

Nothing on the main surface imports this package: `import rstar2_rollout` loads neither the
simulator nor these policies, and the product's `SchedulerConfig` offers neither (recipes,
`rstar2-train --help-config` and `rstar2-rollout serve --policy` see least_requests and
kv_aware). A research policy is configured with `config.ResearchSchedulerConfig` (a
`SchedulerConfig` whose union also holds this package's policies); `scheduler.make_admission`
imports `policies` when such a config names one. What is here:

- `config`: the research policies' config classes and `ResearchSchedulerConfig`;

- `kvprogress`, `kvgate`, `kvbound`: kv_progress, the paper's no-preemption promise kept turn by
  turn on the exact worst case;
- `forecast`: a central queue with admission on a Kaplan-Meier forecast of KV use;
- `peers`: the other frameworks' dispatch (static, power_of_two, cache_aware, least_tokens);
- `simengine`, `simulate`: a model of vLLM V1's scheduler on a virtual clock, and one simulated
  RL step of agentic rollouts through the real `Scheduler` (used by bench/rollout_sched.py and
  bench/calibrate_engine.py);
- `asyncsim`: several RL steps on that simulator with a trainer beside the engines: the
  synchronous steps against bounded-staleness asynchronous ones with partial rollouts (used by
  bench/rollout_async.py).

Why they lost, with the numbers: SCHEDULER.md "Results".
"""
