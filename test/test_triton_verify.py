"""sglang_compat.triton_verify on CPU: which triton backends take sglang's split-KV verify kernel,
the batch its scratch is sized for, and the call in sglang's forward_extend it relies on (the
kernel itself needs a GPU: benchmark/results/2026-12-07-h100-triton-verify-attention-kernels)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from sglang_dynamic_eagle.config import SPLITKV_VERIFY_ENV
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError
from sglang_dynamic_eagle.sglang_compat import triton_verify


def model_runner(algorithm="EAGLE3_DYNAMIC", graphs=(1, 8, 64, 160), disable_cuda_graph=False,
                 graph_backend="full", is_draft_worker=False, kv_cache_dtype=torch.bfloat16):
    decode = SimpleNamespace(bs=list(graphs), max_bs=256, backend=graph_backend)
    return SimpleNamespace(is_draft_worker=is_draft_worker, kv_cache_dtype=kv_cache_dtype, server_args=SimpleNamespace(
        speculative_algorithm=algorithm, disable_cuda_graph=disable_cuda_graph,
        cuda_graph_config=SimpleNamespace(decode=decode)))


class Kernel:
    """Stands in for sglang's verify_splitkv_fwd: records each call's batch and max_bs."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, max_bs=None, **kwargs):
        self.calls.append((args[triton_verify.QO_INDPTR_ARG].shape[0] - 1, max_bs))
        return True


def backend(topk=1, skip_prefill=False, use_mla=False, layout="nhd", enable_deterministic=False,
            dcp_size=1):
    """As sglang's TritonAttnBackend.__init__ leaves the attributes the hook reads."""
    return SimpleNamespace(topk=topk, skip_prefill=skip_prefill, use_verify_splitkv=False,
                           verify_splitkv_fwd=Kernel(), use_mla=use_mla,
                           token_to_kv_pool=SimpleNamespace(kv_cache_layout=layout),
                           enable_deterministic=enable_deterministic, dcp_size=dcp_size)


def verify_args(batch: int):
    args = [None] * 13
    args[triton_verify.QO_INDPTR_ARG] = torch.arange(0, 4 * (batch + 1), 4, dtype=torch.int32)
    return args


def test_an_eagle3_dynamic_chain_on_triton_takes_the_split_kernel_capped_at_its_largest_graph(monkeypatch):
    monkeypatch.delenv(SPLITKV_VERIFY_ENV, raising=False)  # the default
    chain = backend()
    kernel = chain.verify_splitkv_fwd
    runner = model_runner()
    assert triton_verify.after_backend_init(None, chain, runner) is None
    assert chain.use_verify_splitkv
    runner.attn_backend = chain
    assert triton_verify.report(SimpleNamespace(_target_worker=SimpleNamespace(model_runner=runner))) == {
        "splitkv_verify": True}
    # sglang passes its request pool's size; the scratch is sized for the largest graph instead.
    assert chain.verify_splitkv_fwd(*verify_args(160), max_bs=4097) is True
    assert chain.verify_splitkv_fwd(*verify_args(3), max_bs=4097) is True
    assert kernel.calls == [(160, 160), (3, 160)]
    # A batch beyond every graph (an eager verify) declines, so the backend runs its prefill kernel.
    assert chain.verify_splitkv_fwd(*verify_args(161), max_bs=4097) is False
    assert kernel.calls == [(160, 160), (3, 160)]


@pytest.mark.parametrize("env,algorithm,topk,runner,built", [
    ("0", "EAGLE3_DYNAMIC", 1, {}, {}),  # turned off
    ("1", "EAGLE3", 1, {}, {}),  # sglang's own servers are left alone
    ("1", None, 1, {}, {}),
    ("1", "EAGLE3_DYNAMIC", 4, {}, {}),  # a tree: the kernel serves chains only
    ("1", "EAGLE3_DYNAMIC", 1, {"graphs": ()}, {}),  # no graph sizes to cap the scratch at
    ("1", "EAGLE3_DYNAMIC", 1, {"disable_cuda_graph": True}, {}),
    ("1", "EAGLE3_DYNAMIC", 1, {"graph_backend": "disabled"}, {}),  # decode graphs off
    ("1", "EAGLE3_DYNAMIC", 1, {"is_draft_worker": True}, {}),  # the draft never verifies
    ("1", "EAGLE3_DYNAMIC", 1, {}, {"skip_prefill": True}),  # a multi-step draft's per-step backend
    ("1", "EAGLE3_DYNAMIC", 1, {"kv_cache_dtype": torch.float8_e4m3fn}, {}),  # not run: its scales
    ("1", "EAGLE3_DYNAMIC", 1, {"kv_cache_dtype": torch.uint8}, {}),
    ("1", "EAGLE3_DYNAMIC", 1, {"kv_cache_dtype": torch.float16}, {}),  # not run; inf likelier
    ("1", "EAGLE3_DYNAMIC", 1, {}, {"use_mla": True}),  # not run: 576-wide heads
    ("1", "EAGLE3_DYNAMIC", 1, {}, {"layout": "hnd"}),  # not run: another KV layout
    ("1", "EAGLE3_DYNAMIC", 1, {}, {"enable_deterministic": True}),  # sglang's own kernel then
    ("1", "EAGLE3_DYNAMIC", 1, {}, {"dcp_size": 2}),
])
def test_other_servers_backends_stay_as_sglang_built_them(monkeypatch, env, algorithm, topk, runner, built):
    monkeypatch.setenv(SPLITKV_VERIFY_ENV, env)
    untouched = backend(topk, **built)
    kernel = untouched.verify_splitkv_fwd
    runner = model_runner(algorithm, **runner)
    triton_verify.after_backend_init(None, untouched, runner)
    assert untouched.use_verify_splitkv is False and untouched.verify_splitkv_fwd is kernel
    runner.attn_backend = untouched
    assert triton_verify.report(SimpleNamespace(_target_worker=SimpleNamespace(model_runner=runner))) == {
        "splitkv_verify": False}


def test_sglangs_forward_extend_calls_the_kernel_with_the_batch_where_the_cap_reads_it():
    """The cap reads the batch from the call's positional qo_indptr and replaces its max_bs
    keyword: both as sglang 0.5.17's TritonAttnBackend.forward_extend makes the call."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    tree = ast.parse(textwrap.dedent(inspect.getsource(TritonAttnBackend.forward_extend)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and ast.unparse(node.func) == "self.verify_splitkv_fwd"]
    assert len(calls) == 1
    [call] = calls
    assert ast.unparse(call.args[triton_verify.QO_INDPTR_ARG]) == "self.forward_metadata.qo_indptr"
    assert "max_bs" in {keyword.arg for keyword in call.keywords}
    assert "use_verify_splitkv" in inspect.getsource(TritonAttnBackend.forward_extend)


def test_the_kernels_partial_outputs_start_at_zero():
    """Its second stage reads every split's partial and weighs those of splits without keys by 0:
    a NaN left in fresh memory would survive that (0 * NaN is NaN), a zero does not."""
    scratch = SimpleNamespace(att_out=torch.full((2, 4, 16, 4, 8), float("nan")))
    assert triton_verify.zero_new_partials(None, scratch, 2) is None
    assert torch.count_nonzero(scratch.att_out) == 0
    weights = torch.zeros(16)
    weights[0] = 1.0
    assert torch.isnan((torch.full((16,), float("nan")) * weights).sum())
    assert (scratch.att_out[0, 0, :, 0, 0] * weights).sum() == 0


def test_running_out_of_memory_for_the_scratch_is_refused_in_one_line_naming_the_ways_out():
    """The scratch is allocated at the kernel's first call, in the warm-up before sglang captures
    the verify's graphs. sglang turns a RuntimeError there (torch's OutOfMemoryError is one) into
    its own message naming its flags only; the plugin's refusal is not a RuntimeError, so it
    passes through with the switch that turns the kernel off."""

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB\nmore detail")

    verify = triton_verify.capped(out_of_memory, 256)
    with pytest.raises(StartupError) as refused:
        verify(*verify_args(4))
    message = str(refused.value)
    assert not isinstance(refused.value, RuntimeError)
    assert "\n" not in message
    assert f"{SPLITKV_VERIFY_ENV}=0" in message and "--mem-fraction-static" in message
    assert "256 requests" in message and "Tried to allocate 256.00 MiB" in message
    # A batch beyond the cap declines before any allocation.
    assert verify(*verify_args(257)) is False


def test_sglangs_backend_sets_every_attribute_the_hook_reads():
    """What left_on_the_prefill_kernel reads, as sglang 0.5.17's TritonAttnBackend.__init__ and
    ModelRunner set it (a renamed attribute would read as its default and turn the kernel on)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.model_runner import ModelRunner

    init = inspect.getsource(TritonAttnBackend.__init__)
    for attribute in ("topk", "use_mla", "enable_deterministic", "dcp_size", "token_to_kv_pool",
                      "skip_prefill", "use_verify_splitkv", "verify_splitkv_fwd"):
        assert f"self.{attribute} =" in init, attribute
    assert "self.kv_cache_layout = " in inspect.getsource(MHATokenToKVPool)
    assert "self.kv_cache_dtype" in inspect.getsource(ModelRunner.configure_kv_cache_dtype)


def test_running_out_of_memory_after_the_warm_up_declines_to_the_prefill_kernel():
    """Once the scratch exists, a later allocation (an eager verify at another split count) that
    runs out of memory must not take the server down: that verify takes the prefill kernel."""
    calls = []

    def kernel(*args, **kwargs):
        calls.append(kwargs["max_bs"])
        if len(calls) > 1:
            raise torch.OutOfMemoryError("")  # an empty message too
        return True

    verify = triton_verify.capped(kernel, 64)
    assert verify(*verify_args(8)) is True
    assert verify(*verify_args(8)) is False
    assert calls == [64, 64]
