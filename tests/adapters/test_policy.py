"""Policy side: streamed log-probs and PolicyStats equal the model's own logits' values."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from adapters.logprobs import token_logprobs
from adapters.policy import (
    final_hidden_states,
    lm_head_of,
    response_logprobs_and_stats,
    response_logprobs_and_work,
)
from adapters.tiny import tiny_causal_lm
from credit_core import CreditError, policy_stats_from_logits, token_work
from tests.helpers.paths import REPO

pytestmark = pytest.mark.usefixtures("single_torch_thread")

V = 97
TEMPERATURE = 0.7
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [13, 14, 15]]
RESPONSES = [[20, 21, 22, 23], [24, 25], [26]]
PAD = 0


def build_batch(padding: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[prompt | response] with the prompt left- or right-padded, the response right-padded."""
    P = max(map(len, PROMPTS))
    R = max(map(len, RESPONSES))
    ids = torch.full((len(PROMPTS), P + R), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        start = P - len(p) if padding == "left" else 0
        ids[b, start : start + len(p)] = torch.tensor(p)
        mask[b, start : start + len(p)] = 1
        ids[b, P : P + len(r)] = torch.tensor(r)
        mask[b, P : P + len(r)] = 1
    return ids, mask, R


def reference_logits(model: torch.nn.Module, R: int) -> torch.Tensor:
    """(B, R, V) logits predicting each response token, one unpadded row at a time."""
    rows = []
    for p, r in zip(PROMPTS, RESPONSES, strict=True):
        seq = torch.tensor([p + r])
        logits = model(input_ids=seq).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        rows.append(torch.cat([logits, logits.new_zeros(R - len(r), logits.shape[1])]))
    return torch.stack(rows)


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_logprobs_and_stats_match_the_models_own_logits(
    family: str, tie: bool, padding: str
) -> None:
    model = tiny_causal_lm(family, V, tie=tie, hidden=32, dtype=torch.float64, seed=1)
    W, bias = lm_head_of(model)
    assert (W is model.get_input_embeddings().weight) == tie
    assert bias is None
    ids, mask, R = build_batch(padding)
    E = torch.randn(V, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    logp, stats = response_logprobs_and_stats(
        model, ids, mask, R, temperature=TEMPERATURE, reward_embedding=E, chunk_size=40
    )

    with torch.no_grad():
        logits = reference_logits(model, R)
    real = mask[:, -R:].bool()
    resp = torch.where(real, ids[:, -R:], 0)
    expected_logp = torch.log_softmax(logits / TEMPERATURE, -1).gather(2, resp[..., None])[..., 0]
    assert logp.dtype == torch.float64
    torch.testing.assert_close(logp[real], expected_logp[real], rtol=0, atol=1e-10)
    assert torch.all(logp[~real] == 0)

    expected = policy_stats_from_logits(logits, resp, E, temperature=TEMPERATURE)
    assert stats is not None
    for field in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
        got, want = getattr(stats, field)[real], getattr(expected, field)[real]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=field)


def test_lm_head_bias_is_applied() -> None:
    model = tiny_causal_lm("gpt2", V, hidden=32, tie=False, dtype=torch.float64)
    head = torch.nn.Linear(32, V, bias=True, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.normal_(generator=torch.Generator().manual_seed(3))
    model.lm_head = head
    assert lm_head_of(model)[1] is head.bias
    ids, mask, R = build_batch("left")
    E = torch.randn(V, 4, dtype=torch.float64)
    logp, stats = response_logprobs_and_stats(model, ids, mask, R, reward_embedding=E)
    with torch.no_grad():
        logits = reference_logits(model, R)
    real = mask[:, -R:].bool()
    resp = torch.where(real, ids[:, -R:], 0)
    expected = torch.log_softmax(logits, -1).gather(2, resp[..., None])[..., 0]
    torch.testing.assert_close(logp[real], expected[real], rtol=0, atol=1e-10)
    assert stats is not None
    ref = policy_stats_from_logits(logits, resp, E)
    torch.testing.assert_close(stats.m2[real], ref.m2[real], rtol=0, atol=1e-10)


def test_streamed_logprob_gradients_equal_autograd_through_full_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    B, T, H, Vs = 3, 5, 8, 53
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=gen, requires_grad=True)
    W = torch.randn(Vs, H, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(Vs, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, Vs, (B, T), generator=gen)
    upstream = torch.randn(B, T, dtype=torch.float64, generator=gen)

    # chunks of 10 over 53 entries and tiles of 2 rows: several partial tiles both ways
    got = token_logprobs(hidden, W, ids, bias=b, temperature=0.6, chunk_size=10, tile_elements=20)
    grads = torch.autograd.grad((got * upstream).sum(), (hidden, W, b))

    logits = (hidden @ W.T + b) / 0.6
    want = torch.log_softmax(logits, -1).gather(2, ids[..., None])[..., 0]
    want_grads = torch.autograd.grad((want * upstream).sum(), (hidden, W, b))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for name, g, w in zip(("hidden", "weight", "bias"), grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12, msg=name)


def test_bfloat16_inputs_accumulate_in_float32_and_return_bfloat16_gradients() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3, 16, generator=gen)
    W = torch.randn(300, 16, generator=gen) / 4
    ids = torch.randint(0, 300, (2, 3), generator=gen)
    h16 = hidden.bfloat16().requires_grad_(True)
    W16 = W.bfloat16().requires_grad_(True)
    got = token_logprobs(h16, W16, ids, chunk_size=64)
    assert got.dtype == torch.float32
    want = torch.log_softmax(h16.float() @ W16.float().T, -1).gather(2, ids[..., None])[..., 0]
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2)
    # tight: against the same bf16 matmul with everything after it in float32
    exact = torch.log_softmax((h16 @ W16.T).float(), -1).gather(2, ids[..., None])[..., 0]
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-5)
    got.sum().backward()
    assert h16.grad is not None and h16.grad.dtype == torch.bfloat16
    assert W16.grad is not None and W16.grad.dtype == torch.bfloat16


def test_parameter_gradients_through_the_adapter_equal_the_models_own() -> None:
    """A loss on the adapter's log-probs trains the model exactly like one on its logits."""
    model = tiny_causal_lm("llama", V, hidden=32, tie=True, dtype=torch.float64)
    ids, mask, R = build_batch("left")
    real = mask[:, -R:].bool()
    weights = torch.linspace(-1, 1, real.numel(), dtype=torch.float64).reshape(real.shape)

    logp, _ = response_logprobs_and_stats(model, ids, mask, R, temperature=TEMPERATURE)
    got = torch.autograd.grad((logp * weights).sum(), list(model.parameters()))

    logits = reference_logits(model, R)
    resp = torch.where(real, ids[:, -R:], 0)
    ref = torch.log_softmax(logits / TEMPERATURE, -1).gather(2, resp[..., None])[..., 0]
    want = torch.autograd.grad((ref * weights * real).sum(), list(model.parameters()))
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10, msg=name)


class _Wrapper(torch.nn.Module):
    """Holds the model as ``.module`` like DDP or a DeepSpeed engine."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, **kwargs: object) -> object:
        self.calls += 1
        return self.module(**kwargs)


def test_a_wrapped_model_runs_through_the_wrappers_forward() -> None:
    model = tiny_causal_lm("qwen2", V, hidden=32, dtype=torch.float64)
    ids, mask, R = build_batch("left")
    wrapper = _Wrapper(model)
    got, _ = response_logprobs_and_stats(wrapper, ids, mask, R)
    want, _ = response_logprobs_and_stats(model, ids, mask, R)
    assert wrapper.calls == 1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        final_hidden_states(wrapper, ids, mask), final_hidden_states(model, ids, mask)
    )


def test_the_public_api_is_exported_without_importing_transformers() -> None:
    code = (
        "import sys, adapters\n"
        "assert hasattr(adapters, '__all__'), 'adapters is a namespace package here: the "
        "editable install predates adapters/__init__.py; run pip install --no-deps -e .'\n"
        "missing = [n for n in adapters.__all__ if not hasattr(adapters, n)]\n"
        "assert not missing, missing\n"
        "assert 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_bad_inputs_are_clear_errors() -> None:
    model = tiny_causal_lm("gpt2", V, hidden=32)
    ids, mask, R = build_batch("left")
    with pytest.raises(CreditError, match="response_len"):
        response_logprobs_and_stats(model, ids, mask, ids.shape[1])
    with pytest.raises(CreditError, match="attention_mask: expected shape"):
        response_logprobs_and_stats(model, ids, mask[:, 1:], R)
    with pytest.raises(CreditError, match="reward_embedding: expected 97 rows"):
        response_logprobs_and_stats(model, ids, mask, R, reward_embedding=torch.zeros(96, 4))
    no_prompt = mask.clone()
    no_prompt[1, : ids.shape[1] - R] = 0
    with pytest.raises(CreditError, match=r"prompt rows \[1\] have no attended token"):
        response_logprobs_and_stats(model, ids, no_prompt, R)
    out_of_vocab = ids.clone()
    out_of_vocab[2, -R] = V
    with pytest.raises(CreditError, match=r"response tokens must be in \[0, 97\).*rows \[2\]"):
        response_logprobs_and_stats(model, out_of_vocab, mask, R)
    with pytest.raises(CreditError, match="temperature"):
        response_logprobs_and_stats(model, ids, mask, R, temperature=0.0)


@pytest.mark.parametrize("path", ["two_matmul", "stats"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_logprobs_and_work_from_one_forward_equal_the_stats_path(family: str, path: str) -> None:
    model = tiny_causal_lm(family, V, hidden=32, dtype=torch.float64, seed=3)
    ids, mask, R = build_batch("left")
    gen = torch.Generator().manual_seed(4)
    E = torch.randn(V, 6, dtype=torch.float64, generator=gen)
    real = mask[:, -R:].bool()
    g = torch.randn(len(PROMPTS), R, 6, dtype=torch.float64, generator=gen)
    g = g * real.unsqueeze(2)  # the RM gradient is 0 at padding
    logp, w0 = response_logprobs_and_work(
        model,
        ids,
        mask,
        R,
        temperature=TEMPERATURE,
        reward_embedding=E,
        reward_grad=g,
        chunk_size=40,
        path=path,
    )
    want_logp, stats = response_logprobs_and_stats(
        model, ids, mask, R, temperature=TEMPERATURE, reward_embedding=E, chunk_size=40
    )
    assert stats is not None and w0.shape == (len(PROMPTS), R) and w0.dtype == torch.float64
    assert not w0.requires_grad and logp.requires_grad
    assert torch.equal(logp, want_logp)
    torch.testing.assert_close(w0, token_work(stats, g, None), rtol=0, atol=1e-12)
    assert bool((w0[~real] == 0).all()) and bool((w0[real] != 0).all())


def test_logprobs_and_work_run_the_decoder_once() -> None:
    model = tiny_causal_lm("qwen2", V, hidden=32, dtype=torch.float64, seed=5)
    ids, mask, R = build_batch("left")
    E = torch.randn(V, 4, dtype=torch.float64)
    g = torch.randn(len(PROMPTS), R, 4, dtype=torch.float64)
    calls = []
    hook = model.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        response_logprobs_and_work(model, ids, mask, R, reward_embedding=E, reward_grad=g)
    finally:
        hook.remove()
    assert len(calls) == 1
    with pytest.raises(CreditError, match=r"reward_grad: expected shape \(3, 4, 4\)"):
        response_logprobs_and_work(model, ids, mask, R, reward_embedding=E, reward_grad=g[:, :3])
    with pytest.raises(CreditError, match="reward_embedding: expected 97 rows"):
        response_logprobs_and_work(model, ids, mask, R, reward_embedding=E[1:], reward_grad=g)


def test_old_policy_logprobs_and_work_share_one_lm_head_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under no_grad with the two-matmul kernel the log-probs come from the W0 pass itself."""
    import adapters.policy as policy_module

    model = tiny_causal_lm("llama", V, hidden=32, dtype=torch.float64, seed=7)
    ids, mask, R = build_batch("right")
    gen = torch.Generator().manual_seed(8)
    E = torch.randn(V, 5, dtype=torch.float64, generator=gen)
    g = torch.randn(len(PROMPTS), R, 5, dtype=torch.float64, generator=gen)
    kw = {"temperature": TEMPERATURE, "reward_embedding": E, "reward_grad": g, "chunk_size": 24}
    with torch.no_grad():
        want_logp, want_w0 = response_logprobs_and_work(model, ids, mask, R, path="stats", **kw)

    def no_second_pass(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("token_logprobs ran: a second LM-head pass")

    monkeypatch.setattr(policy_module, "token_logprobs", no_second_pass)
    with torch.no_grad():
        logp, w0 = response_logprobs_and_work(model, ids, mask, R, path="two_matmul", **kw)
    assert logp.dtype == want_logp.dtype == torch.float64
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=1e-12)
    torch.testing.assert_close(w0, want_w0, rtol=0, atol=1e-12)
    real = mask[:, -R:].bool()
    assert bool((logp[~real] == 0).all()) and bool((w0[~real] == 0).all())
    with pytest.raises(AssertionError, match="second LM-head pass"):  # with grad: its own pass
        response_logprobs_and_work(model, ids, mask, R, path="two_matmul", **kw)


def test_streamed_logprobs_cast_the_head_per_tile_and_never_sync_the_host() -> None:
    """An fp32 head with bf16 hidden states: no (V, H) copy of the head is made (each tile
    is cast), and backward adds the one-hot term without ``torch.nonzero`` (a host sync per
    tile on a GPU)."""
    from adapters.logprobs import token_logprobs
    from tests.helpers.op_recorder import OpRecorder

    V, H = 40, 8
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, H, generator=g).bfloat16().requires_grad_(True)
    weight = torch.randn(V, H, generator=g).requires_grad_(True)
    ids = torch.randint(0, V, (2, 3), generator=g)
    with OpRecorder() as ops:
        token_logprobs(hidden, weight, ids, chunk_size=16).sum().backward()
    assert (V, H) not in ops.shapes_of("to")
    assert not ops.shapes_of("nonzero")
    assert hidden.grad is not None and weight.grad is not None
