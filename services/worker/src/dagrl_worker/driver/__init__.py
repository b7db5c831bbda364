"""The job driver's side: one process per job that starts the ranks on Ray and runs the steps.

`main` (the driver process's command line) -> `job_driver.Driver` (ranks, restarts, outcome)
-> `training_loop` (which step runs when; `async_pipeline` when the rollout side runs ahead)
over `worker_group` (the ranks as one group, placed by `placement`, with `machine_buffers`).
Each step's merged metrics go to `step_metrics` and `tracking`; `job_progress`,
`restart_policy` and `failure_reasons` keep the job's record.

The driver moves no batch data: it calls the ranks (`dagrl_worker.rank.actors`) and folds
their metric summaries. It may import `dagrl_worker.rank` (the actors it starts) and
`dagrl_worker.shared`; nothing on a rank imports this package.
"""
