"""Placement arithmetic on one machine: what fits, what waits, what never can."""

from __future__ import annotations

import pytest

from llmgw.catalog.model import GpuClass, Profile
from llmgw.catalog.units import Size
from llmgw.scheduler.local.resources import Demand, Ledger, demand_of

from .conftest import GIB, laptop_4c_8g, workstation_16c_64g_2x_l40s

L40S = {"l40s-48g": GpuClass(device="NVIDIA L40S", memory=Size.parse("46068MiB"))}
H100 = {"h100-80g": GpuClass(device="NVIDIA H100 80GB HBM3", memory=Size.parse("81559MiB"))}


def cpu(cores: int, memory: int, name: str = "cpu") -> Demand:
    return Demand(profile=name, cores=cores, memory=Size.parse(memory))


def test_a_cpu_profile_reserves_its_cores_and_memory() -> None:
    """demand_of reads cpu_cores and memory (human size) off the profile."""
    d = demand_of(Profile(name="cpu-2", cpu_cores=2, memory=Size.parse("1.5GiB")), {})
    assert (d.cores, d.memory, d.gpus) == (2, int(1.5 * GIB), 0)


def test_a_gpu_profile_names_the_device_of_its_class() -> None:
    """A GPU profile's demand carries the device string its gpu class maps to."""
    d = demand_of(Profile(name="l40s-1", gpu_class="l40s-48g", gpus=1), L40S)
    assert (d.gpus, d.gpu_device, d.cores, d.memory) == (1, "NVIDIA L40S", 0, 0)


def test_reservations_hand_out_distinct_cores_and_add_up() -> None:
    """Two replicas get disjoint core ids and the free memory is what is left."""
    ledger = Ledger(laptop_4c_8g())
    a = ledger.reserve("a", cpu(2, 2 * GIB))
    b = ledger.reserve("b", cpu(1, 1 * GIB))
    assert set(a.cores).isdisjoint(b.cores)
    assert len(ledger.free_cores()) == 1
    assert ledger.free_memory() == 5 * GIB
    ledger.release("a")
    assert len(ledger.free_cores()) == 3


def test_over_commit_of_cores_is_refused_with_the_free_count() -> None:
    """A replica that does not fit now is refused in the shape of a Nomad placement failure."""
    ledger = Ledger(laptop_4c_8g())
    ledger.reserve("a", cpu(3, GIB))
    assert ledger.why_not_now(cpu(2, GIB)) == "no room for 2 cores on this machine: 1 of 4 free"
    with pytest.raises(ValueError, match="no room for 2 cores"):
        ledger.reserve("b", cpu(2, GIB))


def test_over_commit_of_memory_is_refused_with_sizes() -> None:
    """Memory that is held by others is reported with human sizes."""
    ledger = Ledger(laptop_4c_8g())
    ledger.reserve("a", cpu(1, 7 * GIB))
    assert ledger.why_not_now(cpu(1, 2 * GIB)) == (
        "no room for 2.0GiB of memory on this machine: 1.0GiB of 8.0GiB free")


def test_more_cores_than_the_machine_has_can_never_fit() -> None:
    """Asking for more than the machine has is a never-fits reason, not a wait."""
    ledger = Ledger(laptop_4c_8g())
    reason = ledger.never_fits(cpu(8, GIB, "cpu-8"))
    assert reason is not None
    assert "needs 8 cores; this machine has 4" in reason


def test_more_memory_than_the_machine_has_can_never_fit() -> None:
    """A profile larger than the machine's memory is refused outright."""
    reason = Ledger(laptop_4c_8g()).never_fits(cpu(1, 32 * GIB))
    assert reason is not None
    assert "needs 32.0GiB of memory; this machine has 8.0GiB" in reason


def test_a_gpu_profile_never_fits_a_machine_without_gpus() -> None:
    """A GPU profile on a CPU-only machine says the machine has no GPU."""
    d = demand_of(Profile(name="h100-tp2", gpu_class="h100-80g", gpus=2), H100)
    reason = Ledger(laptop_4c_8g()).never_fits(d)
    assert reason == ("profile 'h100-tp2' needs 2 GPUs (NVIDIA H100 80GB HBM3) "
                      "and this machine has no GPU")


def test_a_gpu_profile_never_fits_other_cards() -> None:
    """A machine with L40S cards cannot run a profile asking for H100s."""
    d = demand_of(Profile(name="h100-1", gpu_class="h100-80g", gpus=1), H100)
    reason = Ledger(workstation_16c_64g_2x_l40s()).never_fits(d)
    assert reason is not None
    assert "this machine has 0 of those (its GPUs: NVIDIA L40S)" in reason


def test_gpus_are_handed_out_by_index_and_counted() -> None:
    """GPU reservations take distinct indexes; a third card is refused with the count."""
    ledger = Ledger(workstation_16c_64g_2x_l40s())
    one = demand_of(Profile(name="l40s-1", gpu_class="l40s-48g", gpus=1), L40S)
    assert ledger.reserve("a", one).gpus == (0,)
    assert ledger.reserve("b", one).gpus == (1,)
    assert ledger.why_not_now(one) == "no room for 1 GPU (NVIDIA L40S) on this machine: 0 of 2 free"
