"""The catalog: what models exist, how each may run, and the rules they obey together."""

from llmgw.catalog.adapter import Adapter
from llmgw.catalog.build import Catalog, Runtime, build_catalog, effective_scaling
from llmgw.catalog.fingerprint import fingerprint, is_stale
from llmgw.catalog.model import GpuClass, Lora, Model, Profile, Scaling, Timeouts
from llmgw.catalog.names import check_name
from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource
from llmgw.catalog.units import Duration, Size, format_size

__all__ = [
    "Adapter", "Catalog", "Duration", "GpuClass", "HfSource", "Lora", "Model", "PathSource",
    "PkgSource",
    "Profile", "Runtime", "Scaling", "Size", "Source", "Timeouts", "UrlSource",
    "build_catalog", "check_name", "effective_scaling", "fingerprint", "format_size",
    "is_stale",
]
