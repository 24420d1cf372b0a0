"""Training backends: how a batch of trajectories becomes new weights.

`policy.Policy` is the one interface the loop uses (update, SFT, save, restore, reset the
optimizer, export, and `weights()`: what a push reads). `policy.DriverPolicy` trains in the
driver as a world of one; `sharded_policy.ShardedPolicy` trains on FSDP2 ranks (`train_workers`).
Both run the same step, `distributed.train_step`, over the same micro-batches (`batching`) and
loss (`update`); `precision` holds the dtype rules, `gather` a rank's weights as full tensors in
the engines' dtype, `offload` where a rank's training state lives and the rule its collectives
check. Nothing here imports `placement`: where the weights go is the placement's weight mover.
"""
