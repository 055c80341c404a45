"""The pure replica choice and passive-health bookkeeping (no servers)."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

from llmgw.gateway.prefix import PrefixKey, prefix_key
from llmgw.gateway.ring import HashRing, point
from llmgw.gateway.routing import SPILL, UNLIMITED, Balancer, EngineSample
from llmgw.gateway.signals import parse_metrics

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


def test_least_outstanding_wins() -> None:
    """The replica with the fewest requests in flight is chosen."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.acquire(A)
    bal.acquire(A)
    bal.acquire(B)
    assert bal.choose([A, B, C], now=0) == C
    bal.acquire(C)
    bal.acquire(C)
    assert bal.choose([A, B, C], now=0) == B


def test_ties_rotate_so_sequential_traffic_spreads() -> None:
    """With no request in flight anywhere, successive choices visit every replica."""
    bal = Balancer(eject_for=10, eject_max=60)
    chosen = [bal.choose([A, B, C], now=0) for _ in range(6)]
    assert set(chosen) == {A, B, C}


def test_release_never_goes_negative() -> None:
    """An extra release cannot make a replica look less loaded than idle."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.release(A)
    bal.acquire(A)
    bal.release(A)
    bal.release(A)
    assert bal.outstanding(A) == 0
    bal.acquire(B)
    bal.acquire(A)
    assert bal.outstanding(A) == 1


def test_excluded_replicas_are_not_chosen() -> None:
    """A replica this request already tried is skipped; none left gives None."""
    bal = Balancer(eject_for=10, eject_max=60)
    assert bal.choose([A, B], now=0, exclude={A}) == B
    assert bal.choose([A, B], now=0, exclude={A, B}) is None
    assert bal.choose([], now=0) is None


def test_failed_replica_is_ejected_for_the_back_off_period() -> None:
    """After a failure the replica is not chosen until eject_for has passed."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.failed(A, now=100)
    assert all(bal.choose([A, B], now=t) == B for t in (100, 105, 109.9))
    assert bal.choose([A], now=109.9) is None
    assert bal.choose([A], now=110.1) == A
    assert bal.back_in([A, B], now=104) == 6


def test_repeated_failures_double_the_ejection_up_to_the_maximum() -> None:
    """Each failure after coming back doubles the ejection, capped at eject_max."""
    bal = Balancer(eject_for=10, eject_max=35)
    assert bal.failed(A, now=0) == 10
    assert bal.failed(A, now=11) == 11 + 20
    assert bal.failed(A, now=32) == 32 + 35
    bal.succeeded(A)
    assert bal.failed(A, now=100) == 110


def test_failures_during_an_ejection_count_once() -> None:
    """Many in-flight requests failing at one crash are one failure, not many doublings."""
    bal = Balancer(eject_for=10, eject_max=1000)
    for _ in range(30):
        bal.failed(A, now=50)
    assert bal.back_in([A], now=50) == 10
    assert bal.failed(A, now=61) == 61 + 20


def test_prune_forgets_gone_replicas_but_keeps_ejected_and_busy_ones() -> None:
    """State of replicas that left discovery is dropped unless ejected or in flight."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.acquire(A)
    bal.release(A)
    bal.acquire(B)
    bal.failed(C, now=0)
    bal.prune(live=set(), now=1)
    assert bal.is_ejected(C, now=1)
    assert bal.outstanding(B) == 1
    assert A not in bal._state


PURE = ["routing", "ring", "prefix", "scaling"]
ALLOWED = {"__future__", "collections", "dataclasses", "math", "msgspec", "bisect", "hashlib",
           "typing"}


@pytest.mark.parametrize("name", PURE)
def test_decision_modules_import_no_io_library(name: str) -> None:
    """The decision modules stay pure: they import no I/O library and no I/O module of llmgw."""
    module = importlib.import_module(f"llmgw.gateway.{name}")
    tree = ast.parse(Path(module.__file__ or "").read_text())
    imported = {alias.name for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    ours = {m for m in imported if m.startswith("llmgw")}
    assert {m.split(".")[0] for m in imported - ours} <= ALLOWED
    assert ours <= {"llmgw.catalog.model", *(f"llmgw.gateway.{p}" for p in PURE)}


# ------------------------------------------------------------------ policies

def keyed(i: int, follows: bool = True) -> PrefixKey:
    return PrefixKey(point(f"session-{i}".encode()), follows)


def test_prefix_affinity_sends_one_key_to_one_replica_and_spreads_keys() -> None:
    """The same prefix key always lands on the same replica; many keys use every replica."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C]
    homes = {i: bal.pick(urls, 0, policy="prefix-affinity", key=keyed(i)) for i in range(60)}
    assert all(bal.pick(urls, 0, policy="prefix-affinity", key=keyed(i)) == homes[i]
               for i in range(60))
    assert set(homes.values()) == {A, B, C}


def test_a_replica_leaving_the_ring_moves_only_its_own_keys() -> None:
    """Ejecting one replica re-homes its keys; every other key keeps its replica (and cache)."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C]
    before = {i: bal.pick(urls, 0, policy="prefix-affinity", key=keyed(i)) for i in range(200)}
    bal.failed(B, now=0)
    after = {i: bal.pick(urls, 1, policy="prefix-affinity", key=keyed(i)) for i in range(200)}
    assert B not in after.values()
    assert all(after[i] == before[i] for i in before if before[i] != B)
    gone = {i: bal.pick([A, C], 1, policy="prefix-affinity", key=keyed(i)) for i in range(200)}
    assert gone == after


def test_bounded_load_passes_a_hot_key_on_to_the_next_replica() -> None:
    """A key's home over load_factor times the mean load passes the request on."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C]
    home = bal.pick(urls, 0, policy="prefix-affinity", key=keyed(1))
    assert home is not None
    for _ in range(3):
        bal.acquire(home)
    # Loads (3, 0, 0): bound = ceil(1.25 * 4 / 3) + 1 = 3, so the home is over it.
    spill = bal.pick(urls, 0, policy="prefix-affinity", key=keyed(1), load_factor=1.25)
    assert spill not in (home, None)
    # A generous factor keeps it home.
    fresh = Balancer(eject_for=10, eject_max=60)
    for _ in range(3):
        fresh.acquire(home)
    assert fresh.pick(urls, 0, policy="prefix-affinity", key=keyed(1), load_factor=4.0) == home


def test_prefix_affinity_without_a_key_places_by_load() -> None:
    """A request with no prefix key goes to the least loaded replica."""
    bal = Balancer(eject_for=10, eject_max=60)
    bal.acquire(A)
    bal.acquire(B)
    assert bal.pick([A, B, C], 0, policy="prefix-affinity", key=None) == C


def test_round_robin_visits_every_usable_replica_in_turn() -> None:
    """Round robin takes each replica in turn and skips the ejected."""
    bal = Balancer(eject_for=10, eject_max=60)
    assert {bal.pick([A, B, C], 0, policy="round-robin") for _ in range(3)} == {A, B, C}
    bal.failed(A, now=0)
    assert {bal.pick([A, B, C], 1, policy="round-robin") for _ in range(6)} == {B, C}


# ------------------------------------------------------------------ engine signals

def sample(running: int, waiting: int) -> EngineSample:
    return EngineSample(running=running, waiting=waiting)


def test_load_is_the_engine_count_brought_up_to_date_by_what_was_sent_since() -> None:
    """A fresh scrape counts every gateway's requests; sends since it are added."""
    bal = Balancer(eject_for=10, eject_max=60, signal_ttl=3)
    bal.acquire(A)
    bal.observe(A, sample(running=5, waiting=2), now=0)
    assert bal.load(A, now=1) == 7
    bal.acquire(A)
    assert bal.load(A, now=1) == 8
    assert bal.load(A, now=10) == 2          # stale: this gateway's own count
    bal.observe(A, None, now=11)
    assert bal.load(A, now=11) == 2          # a failed scrape: own count


def test_headroom_follows_max_concurrency_and_the_engine_queue() -> None:
    """Saturated at max_concurrency in flight, or at more than max_waiting waiting."""
    bal = Balancer(eject_for=10, eject_max=60, signal_ttl=3)
    assert bal.headroom(A, 0, None, 5) == UNLIMITED
    bal.acquire(A)
    bal.acquire(A)
    assert bal.headroom(A, 0, 3, 5) == 1
    bal.observe(A, sample(running=16, waiting=4), now=0)
    assert bal.headroom(A, 0, None, 5) == 2      # 4 waiting, up to 5: two more
    bal.acquire(A)
    assert bal.headroom(A, 0, None, 5) == 1      # sent since the scrape joins the queue
    bal.release(A)
    bal.release(A)
    bal.release(A)
    assert bal.headroom(A, 0, None, 5) == 4      # finished since: the queue moved up
    bal.observe(A, sample(running=10, waiting=0), now=1)
    assert bal.headroom(A, 1, None, 5) == UNLIMITED   # no queue: room until told otherwise


def test_parse_metrics_reads_vllm_llama_cpp_and_sglang_pages() -> None:
    """The queue figures are read from vLLM's, llama.cpp's and SGLang's pages, summed over
    label sets."""
    vllm = (b'# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
            b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            b'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
            b'vllm:num_requests_waiting{engine="0",model_name="m {x}"} 4.0 1700000000\n'
            b'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
            b'vllm:prefix_cache_queries_total{engine="0"} 100\n'
            b'vllm:prefix_cache_hits_total{engine="0"} 60\n'
            b'vllm:time_to_first_token_seconds_bucket{le="0.1"} 9\n')
    got = parse_metrics(vllm)
    assert got == EngineSample(running=5, waiting=4, kv_usage=0.5, prefix_queries=100.0,
                               prefix_hits=60.0)
    llama = b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n"
    assert parse_metrics(llama) == EngineSample(running=1, waiting=2)
    sglang = (b'sglang:num_running_reqs{model_name="m",engine_type="unified"} 8.0\n'
              b'sglang:num_queue_reqs{model_name="m",engine_type="unified"} 4.0\n'
              b'sglang:token_usage{model_name="m",engine_type="unified"} 0.25\n'
              b'sglang:cache_hit_rate{model_name="m",engine_type="unified"} 0.5\n')
    assert parse_metrics(sglang) == EngineSample(running=8, waiting=4, kv_usage=0.25)


@pytest.mark.parametrize("page", [b"", b"not prometheus at all", b"\xff\xfe\x00",
                                  b"vllm:num_requests_running NaN\n",
                                  b"vllm:num_requests_running{oops\n"])
def test_parse_metrics_gives_nothing_for_a_page_without_queue_figures(page: bytes) -> None:
    """A missing or malformed page yields None (routing falls back to in-flight counts)."""
    assert parse_metrics(page) is None


# ------------------------------------------------------------------ prefix keys

SYSTEM = {"role": "system", "content": "You are the support bot of Example Corp. " * 40}


def chat(*messages: object) -> bytes:
    return json.dumps({"model": "m", "messages": list(messages)}).encode()


def test_every_turn_of_a_conversation_has_the_key_of_its_opening() -> None:
    """A chat's key covers the messages before the first assistant message."""
    user1 = {"role": "user", "content": "my order 1234 is late"}
    first = prefix_key(chat(SYSTEM, user1), 512)
    later = prefix_key(chat(SYSTEM, user1, {"role": "assistant", "content": "Sorry!"},
                            {"role": "user", "content": "when will it come?"}), 512)
    assert first is not None
    assert later is not None
    assert first.point == later.point
    assert (first.follows, later.follows) == (False, True)


def test_conversations_sharing_only_a_system_prompt_have_different_keys() -> None:
    """A long shared system prompt does not put every conversation on one replica."""
    a = prefix_key(chat(SYSTEM, {"role": "user", "content": "question a"}), 64)
    b = prefix_key(chat(SYSTEM, {"role": "user", "content": "question b"}), 64)
    assert a != b


def test_a_completion_prompt_is_keyed_by_its_first_bytes() -> None:
    """Completions sharing their first prefix_bytes share a key."""
    a = prefix_key(b'{"model":"m","prompt":"' + b"x" * 100 + b'tail one"}', 50)
    b = prefix_key(b'{"model":"m","prompt":"' + b"x" * 100 + b'tail two"}', 50)
    assert a is not None
    assert a == b


@pytest.mark.parametrize("body", [
    b'{"model":"m"}', b'{"model":"m","messages":[]}', b'{"model":"m","messages":null}',
    b'{"model":"m","messages":"not a list"}', b'{"model":"m","messages":[1,"two",null]}',
    b'{"model":"m","messages":[{"role":"user","content":""}]}',
    b'{"model":"m","messages":[{"role":"user","content":[{"type":"image_url",'
    b'"image_url":{"url":"https://example.com/cat.png"}}]}]}',
    b'{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":'
    b'"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42"}]}',
    b'{"model":"m","messages":[{"role":7,"content":{"deep":[[[[]]]]}}]}',
    b'{"model":"m","prompt":[1,2,3]}', b'{"model":"m","prompt":""}', b"[]", b"not json",
])
def test_a_prompt_of_any_shape_gets_a_key_or_none_and_never_an_error(body: bytes) -> None:
    """Odd request shapes are keyed or left unkeyed, never raise."""
    key = prefix_key(body, 256)
    assert key is None or isinstance(key, PrefixKey)


def test_prefix_affinity_bounds_the_prefill_queue_not_the_decoding_requests() -> None:
    """Requests past their first token no longer count against a replica's bound."""
    urls = [A, B, C]
    bal = Balancer(eject_for=10, eject_max=60)
    home = HashRing(urls).choose(keyed(7).point, urls, lambda u: 0, 1.25)
    assert home is not None
    for _ in range(4):
        bal.acquire(home)
        bal.succeeded(home)      # first token arrived: decoding now
    assert bal.pending(home, 0) == 0
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(7)) == home
    prefilling = Balancer(eject_for=10, eject_max=60)
    for _ in range(3):
        prefilling.acquire(home)  # three still prefilling
    assert prefilling.pending(home, 0) == 3
    assert prefilling.pick(urls, 0, policy="prefix-affinity", key=keyed(7)) != home


def test_a_turn_goes_where_the_previous_turn_of_its_conversation_went() -> None:
    """A turn passed on from a busy home is followed there by the next one (its longest
    cached prefix), while that replica is within the bound."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C]
    home = bal.pick(urls, 0, policy="prefix-affinity", key=keyed(5))
    assert home is not None
    for _ in range(3):
        bal.acquire(home)
    moved = bal.pick(urls, 0, policy="prefix-affinity", key=keyed(5))
    assert moved not in (home, None)
    for _ in range(3):
        bal.release(home, awaiting=True)
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(5)) == moved
    other = Balancer(eject_for=10, eject_max=60)   # another worker: the ring's answer
    assert other.pick(urls, 0, policy="prefix-affinity", key=keyed(5)) == home


def test_a_later_turn_from_another_process_waits_behind_one_prefill_at_its_home() -> None:
    """A later turn this process did not place goes to its ring home with one prefill there."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C, "http://10.0.0.4:8000"]
    home = HashRing(urls).order(keyed(3).point, urls)[0]
    bal.acquire(home)     # one request prefilling at home, none elsewhere
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(3, follows=True)) == home


def test_a_new_conversation_goes_to_the_shortest_prefill_queue_not_its_ring_home() -> None:
    """A first turn has nothing cached anywhere: one prefill at its home sends it elsewhere."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C, "http://10.0.0.4:8000"]
    order = HashRing(urls).order(keyed(3).point, urls)
    bal.acquire(order[0])
    bal.acquire(order[1])
    bal.succeeded(order[1])   # decoding: not in the prefill queue, but one more request
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(3, follows=False)) == order[2]


def test_on_an_idle_fleet_every_process_opens_a_conversation_at_its_ring_home() -> None:
    """With equal queues the ring breaks the tie, so another worker's answer for the next
    turn is the replica that holds the first."""
    urls = [A, B, C]
    ring = HashRing(urls)
    for i in range(40):
        opened = Balancer(eject_for=10, eject_max=60).pick(
            urls, 0, policy="prefix-affinity", key=keyed(i, follows=False))
        later = Balancer(eject_for=10, eject_max=60).pick(
            urls, 0, policy="prefix-affinity", key=keyed(i, follows=True))
        assert opened == later == ring.order(keyed(i).point, urls)[0]


def test_a_placed_conversation_stays_until_its_queue_is_spill_longer_than_the_shortest() -> None:
    """Its replica's queue may be SPILL - 1 over the shortest; at SPILL the next turn moves
    to the shortest queue and stays there."""
    bal = Balancer(eject_for=10, eject_max=60)
    urls = [A, B, C]
    first = bal.pick(urls, 0, policy="prefix-affinity", key=keyed(8, follows=False))
    assert first is not None
    for _ in range(SPILL - 1):
        bal.acquire(first)
    bal.acquire(next(u for u in urls if u != first))   # the shortest queue is not the longest
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(8)) == first
    bal.acquire(first)
    emptiest = next(u for u in urls if bal.pending(u, 0) == 0)
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(8)) == emptiest
    for _ in range(SPILL):
        bal.release(first, awaiting=True)
    assert bal.pick(urls, 0, policy="prefix-affinity", key=keyed(8)) == emptiest


def test_ring_order_starts_at_the_home_and_names_each_usable_replica_once() -> None:
    """The order new conversations break ties in: the home, then clockwise, skipping the
    unusable."""
    urls = [A, B, C]
    ring = HashRing(urls)
    key = keyed(2).point
    order = ring.order(key, urls)
    assert sorted(order) == sorted(urls)
    assert order[0] == ring.choose(key, urls, lambda u: 0, 1.25)
    assert ring.order(key, [u for u in urls if u != order[0]]) == order[1:]
