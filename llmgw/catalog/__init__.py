"""The catalog: what models exist, how each may run, and the rules they obey together."""

from llmgw.catalog.build import Catalog, build_catalog, check_name, effective_scaling
from llmgw.catalog.fingerprint import fingerprint, is_stale
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling, Timeouts
from llmgw.catalog.units import format_size, parse_duration, parse_size

__all__ = [
    "Catalog", "GpuClass", "Model", "Profile", "Scaling", "Timeouts", "build_catalog",
    "check_name", "effective_scaling", "fingerprint", "format_size", "is_stale",
    "parse_duration", "parse_size",
]
