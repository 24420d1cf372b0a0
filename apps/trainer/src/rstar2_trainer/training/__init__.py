"""Training backends: how a batch of trajectories becomes new weights.

`policy.Policy` is the one interface the loop uses (update, sync to engines, save, restore,
reset the optimizer, export). `policy.DriverPolicy` trains in the driver as a world of one;
`worker_policy.WorkerPolicy` trains on FSDP2 ranks (`train_workers`). Both run the same step,
`distributed.train_step`, over the same micro-batches (`batching`) and loss (`update`);
`precision` holds the dtype rules and `weight_sync` the transfer of weights to the engines.
"""
