"""Typed configuration for every ZipRL component, in one place: the schema (:mod:`ziprl.config.schema`: the sections,
each field's help and range, validation) and the loader (:mod:`ziprl.config.loader`: YAML file, then
``section.field=value`` overrides). ``python -m ziprl.config --show [--config FILE] [--set a.b=c]`` prints the
effective config with each field's help (:mod:`ziprl.config.show`)."""

from ziprl.config.loader import apply_override, differences, from_dict, load_config, yaml_value
from ziprl.config.schema import (
    DTYPES,
    HTTP_TOKEN_ENV,
    INT_MAX,
    LOOPBACK,
    RANGES,
    ConfigError,
    DataConfig,
    DemoConfig,
    EnvConfig,
    LearnerConfig,
    ModelConfig,
    RayConfig,
    RetrieverConfig,
    RunConfig,
    SamplingConfig,
    ScoringConfig,
    SFTConfig,
    WeightsConfig,
    ZipRLConfig,
    check_range,
    check_top_k,
    resolve_engine_dtype,
)
from ziprl.config.show import describe, main

__all__ = [
    "DTYPES", "HTTP_TOKEN_ENV", "INT_MAX", "LOOPBACK", "RANGES", "ConfigError", "DataConfig",
    "DemoConfig", "EnvConfig", "LearnerConfig", "ModelConfig", "RayConfig", "RetrieverConfig", "RunConfig",
    "SFTConfig", "SamplingConfig", "ScoringConfig", "WeightsConfig", "ZipRLConfig", "apply_override", "check_range",
    "check_top_k", "describe", "differences", "from_dict", "load_config", "main", "resolve_engine_dtype", "yaml_value",
]
