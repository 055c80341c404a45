"""The catalog: what models exist, how each may run, and the rules they obey together."""

from llmgw.catalog.build import Catalog, Runtime, build_catalog, check_name, effective_scaling
from llmgw.catalog.fingerprint import fingerprint, is_stale
from llmgw.catalog.model import GpuClass, Model, Profile, Scaling, Timeouts
from llmgw.catalog.source import HfSource, PathSource, PkgSource, Source, UrlSource
from llmgw.catalog.units import Duration, Size, format_size

__all__ = [
    "Catalog", "Duration", "GpuClass", "HfSource", "Model", "PathSource", "PkgSource",
    "Profile", "Runtime", "Scaling", "Size", "Source", "Timeouts", "UrlSource",
    "build_catalog", "check_name", "effective_scaling", "fingerprint", "format_size",
    "is_stale",
]
