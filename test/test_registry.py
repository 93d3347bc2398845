"""The registry of sglang internals: every named code path exists in the installed sglang, every
hook is in effect after sglang's plugin loading, and a hook that is not fails start-up with one
line. Also the token-id guard, which is one of those hooks."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest
from sglang.srt.plugins.hook_registry import HookType

from sglang_dynamic_eagle.engine.observations import RequestAcceptance, observe
from sglang_dynamic_eagle.sglang_compat import registry
from sglang_dynamic_eagle.sglang_compat.hooks import batch_selection, request_guards
from sglang_dynamic_eagle.sglang_compat.registry import HOOKS, KINDS, RELIANCES, HookSpec

CODE_PATHS = sorted({path for reliance in RELIANCES for path in reliance.code})


def test_every_reliance_is_complete() -> None:
    for reliance in RELIANCES:
        assert reliance.kind in KINDS, reliance.target
        for field in ("target", "how", "why", "drop_when"):
            assert getattr(reliance, field).strip(), (reliance.target, field)
        if reliance.kind in (registry.ATTRIBUTE_SWAP, registry.HOOK):
            assert reliance.code and reliance.patched_by, reliance.target


@pytest.mark.parametrize("path", sorted({p for r in RELIANCES for p in r.patched_by}))
def test_every_patching_function_exists(path: str) -> None:
    assert path.startswith("sglang_dynamic_eagle.") and callable(registry.resolve(path))


def test_start_up_finds_every_code_path() -> None:
    assert registry.missing_code_paths() == []


def test_a_missing_code_path_stops_start_up(loaded_plugins, monkeypatch) -> None:
    renamed = "sglang.srt.managers.scheduler.Scheduler._apply_war_barrier_v2"
    reliance = registry.UpstreamReliance(
        target="a renamed method", how="-", why="-", drop_when="-", kind=registry.BEHAVIOUR,
        code=(renamed,))
    monkeypatch.setattr(registry, "RELIANCES", RELIANCES + (reliance,))
    with pytest.raises(RuntimeError) as excinfo:
        registry.check_at_start_up()
    message = str(excinfo.value)
    assert "\n" not in message and renamed in message and "sglang==0.5.17" in message


def test_the_scheduler_checks_the_registry_before_it_builds_the_worker(monkeypatch) -> None:
    from sglang_dynamic_eagle.sglang_compat import plugin

    def refuse() -> None:
        raise RuntimeError("sglang-dynamic-eagle: hooks not in effect")

    monkeypatch.setattr(registry, "check_at_start_up", refuse)
    with pytest.raises(RuntimeError, match="hooks not in effect"):
        plugin._worker_class(None)


@pytest.mark.parametrize("path", CODE_PATHS)
def test_code_path_exists_in_installed_sglang(path: str) -> None:
    registry.resolve(path)


def test_a_renamed_target_does_not_resolve() -> None:
    with pytest.raises(AttributeError):
        registry.resolve("sglang.srt.managers.scheduler.Scheduler.get_internal_state_v2")
    with pytest.raises(ImportError):
        registry.resolve("sglang_not_installed.module.name")


def test_every_hook_target_is_listed_as_a_hook_reliance() -> None:
    hook_paths = {path for r in RELIANCES if r.kind == registry.HOOK for path in r.code}
    assert {spec.target for spec in HOOKS} <= hook_paths
    patched_by = {path for r in RELIANCES if r.kind == registry.HOOK for path in r.patched_by}
    assert {f"{spec.hook.__module__}.{spec.hook.__qualname__}" for spec in HOOKS} == patched_by


def test_every_hook_is_in_effect_after_load_plugins(loaded_plugins) -> None:
    assert registry.missing_hooks() == []
    registry.check_hooks_in_effect()
    registry.check_at_start_up()


def test_a_hook_that_was_not_applied_stops_start_up(loaded_plugins, monkeypatch) -> None:
    def never_registered(*args, **kwargs):
        return None

    target = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
    monkeypatch.setattr(
        registry, "HOOKS", HOOKS + (HookSpec(target, never_registered, HookType.AFTER),)
    )
    assert registry.missing_hooks() == [target]
    with pytest.raises(RuntimeError) as excinfo:
        registry.check_hooks_in_effect()
    message = str(excinfo.value)
    assert "\n" not in message and target in message and "sglang==0.5.17" in message


def test_a_hook_on_a_missing_target_is_reported(loaded_plugins, monkeypatch) -> None:
    target = "sglang.srt.managers.scheduler.Scheduler.renamed_method"
    spec = HookSpec(target, request_guards.check_request_token_ids, HOOKS[0].hook_type)
    monkeypatch.setattr(registry, "HOOKS", (spec,))
    assert registry.missing_hooks() == [target]


def test_the_batch_selection_hook_is_installed_on_the_scheduler_loop() -> None:
    [spec] = [s for s in HOOKS if s.hook is batch_selection.batch_selected]
    assert spec.target == "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
    assert spec.hook_type == HookType.AFTER


# --------------------------------------------------------------------------- the policy's inputs


def test_the_batch_selection_hook_gives_the_worker_the_batch_and_the_waiting_queue() -> None:
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker

    calls, attached = [], []
    worker = DynamicEagleWorker.__new__(DynamicEagleWorker)  # no GPU: only its hook entry point
    worker.batch_selected = lambda batch, queued: calls.append((batch, queued))
    worker.attach_scheduler = attached.append
    scheduler = SimpleNamespace(draft_worker=worker, waiting_queue=["a", "b", "c"])
    batch, running = object(), object()
    plan = NextBatchPlan(batch_to_run=batch, running_batch=running)  # sglang's own result type
    assert batch_selection.batch_selected(plan, scheduler) is plan
    scheduler.waiting_queue = []
    batch_selection.batch_selected(NextBatchPlan(batch_to_run=None, running_batch=running),
                                   scheduler)
    assert calls == [(batch, 3), (None, 0)]
    assert attached == [scheduler, scheduler]  # the worker attaches once (EarlyFirstToken.attach)


def test_the_batch_selection_hook_leaves_other_servers_alone() -> None:
    eagle_worker = SimpleNamespace(batch_selected=lambda *a: pytest.fail("called"))  # another algorithm's
    result = object()
    for scheduler in (SimpleNamespace(draft_worker=None, waiting_queue=[1]),
                      SimpleNamespace(draft_worker=eagle_worker, waiting_queue=[1]),
                      SimpleNamespace()):
        assert batch_selection.batch_selected(result, scheduler) is result


def test_observe_reads_sglangs_own_requests() -> None:
    """The fields of sglang's Req the policy's view is built from (``engine.observations``)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    limited = Req("a", "", array("q", [1, 2, 3]), SamplingParams(max_new_tokens=10))
    unlimited = Req("b", "", array("q", [4]), SamplingParams(max_new_tokens=None))
    limited.output_ids.extend([5, 6])
    limited.kv_committed_len, unlimited.kv_committed_len = 5, 40
    acceptance = RequestAcceptance()
    acceptance.launched([limited])
    acceptance.verified([2])  # records hold a weak reference to their request: weakly referenceable
    observation = observe(SimpleNamespace(reqs=[limited, unlimited]), 4, acceptance, 9)
    assert (observation.batch_size, observation.kv_tokens, observation.queued,
            observation.step) == (2, 45, 4, 9)
    assert list(observation.remaining) == [8, 1 << 30]
    assert (list(observation.verifies), list(observation.accepted)) == ([1, 0], [3, 0])
    # Above the limit (the speculative graphs; 0 for the threshold policy) the per-request
    # records are not read: the step is plain whatever they say.
    above = observe(SimpleNamespace(reqs=[limited, unlimited]), 4, acceptance, 10,
                    per_request_up_to=1)
    assert (above.batch_size, above.kv_tokens) == (2, 45)
    assert not above.verifies and not above.remaining


# --------------------------------------------------------------------------- token-id guard

VOCAB = 512


@pytest.mark.parametrize("ids", [[], [0], [5, 511, 7], list(range(VOCAB))])
def test_token_ids_inside_the_vocabulary_pass(ids: list) -> None:
    request_guards.check_token_ids(ids, VOCAB)


@pytest.mark.parametrize(
    ("ids", "position", "shown"),
    [
        ([5, -2, 7], 1, "-2"),
        ([5, 512], 1, "512"),
        ([10**12], 0, str(10**12)),
        ([1, 2.0], 1, "2.0"),
        ([True, 3], 0, "True"),
        (["7"], 0, "'7'"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(ids: list, position: int, shown: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        request_guards.check_token_ids(ids, VOCAB)
    message = str(excinfo.value)
    assert "\n" not in message
    assert f"input_ids[{position}] is {shown}" in message
    assert f"[0, {VOCAB})" in message


def _tokenizer_manager(vocab_size: int = VOCAB) -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=vocab_size))


def test_numpy_integer_ids_pass_and_numpy_bad_ids_are_refused() -> None:
    numpy = pytest.importorskip("numpy")
    request_guards.check_token_ids(list(numpy.array([1, 2, 511], dtype=numpy.int64)), VOCAB)
    with pytest.raises(ValueError, match=r"input_ids\[2\]"):
        request_guards.check_token_ids(list(numpy.array([1, 2, 512], dtype=numpy.int32)), VOCAB)


def test_guard_checks_client_ids_only() -> None:
    manager = _tokenizer_manager()
    text_request = SimpleNamespace(input_ids=None)
    request_guards.check_request_token_ids(manager, text_request, [9999])
    token_request = SimpleNamespace(input_ids=[1, 9999])
    with pytest.raises(ValueError, match=r"input_ids\[1\] is 9999"):
        request_guards.check_request_token_ids(manager, token_request, [1, 9999])
    image_request = SimpleNamespace(input_ids=[1, 9999], image_data=["img"])
    request_guards.check_request_token_ids(manager, image_request, [1, 9999])


def test_guard_is_in_sglangs_request_validation(loaded_plugins) -> None:
    """After plugin loading, sglang's own length check refuses out-of-vocabulary ids."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    manager = SimpleNamespace(
        model_config=SimpleNamespace(vocab_size=VOCAB),
        context_len=4096,
        num_reserved_tokens=0,
        allow_auto_truncate=False,
        validate_total_tokens=True,
    )
    request = SimpleNamespace(input_ids=[5, -2, 7], sampling_params={"max_new_tokens": 4})
    with pytest.raises(ValueError, match=r"input_ids\[1\] is -2"):
        TokenizerManager._validate_one_request(manager, request, [5, -2, 7])
