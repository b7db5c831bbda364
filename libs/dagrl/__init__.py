"""dagrl: reinforcement-learning post-training of LLMs as a DAG of small services.

This package is the shared core: what two or more services use. It never imports
a service (`dagrl_scheduler`, `dagrl_databuffer`, `dagrl_worker`, `dagrl_metrics`).
"""

__version__ = "0.1.0"
