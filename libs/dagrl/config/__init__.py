"""Typed, frozen configuration: the job's tree, YAML + dotted overrides, loud errors."""

from dagrl.config.job import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    FilterGroupsConfig,
    JobConfig,
    KLControlConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    ServicesConfig,
    TrainerConfig,
    WorkflowConfig,
)
from dagrl.config.loading import apply_overrides, load_job_config, read_yaml_mapping
from dagrl.config.node import NodeConfig, node_config
from dagrl.config.typed import build, field_doc, nested, option, to_dict

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "DataConfig",
    "FilterGroupsConfig",
    "JobConfig",
    "KLControlConfig",
    "ModelConfig",
    "NodeConfig",
    "OptimConfig",
    "RefConfig",
    "RewardConfig",
    "RolloutConfig",
    "SamplingConfig",
    "ServicesConfig",
    "TrainerConfig",
    "WorkflowConfig",
    "apply_overrides",
    "build",
    "field_doc",
    "load_job_config",
    "nested",
    "node_config",
    "option",
    "read_yaml_mapping",
    "to_dict",
]
