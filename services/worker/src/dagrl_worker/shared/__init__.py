"""What the driver and the ranks both read: the worker's process settings (`config`), the job as
plain data (`spec`), the scheduler's plan as the worker reads it (`plan_view`) and metric
summaries with their reducers (`metrics`). Imports neither `dagrl_worker.driver` nor
`dagrl_worker.rank`.
"""
