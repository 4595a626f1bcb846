"""The knobs of issue 45's fidelity sweep (docs/design.md, "Direction-model fidelity and a
peaked policy"): the direction RM's degraded training labels (``RMTrainConfig.label_noise``,
``label_threshold``; the length task's additive proxy, ``rm_proxy``), the peaked pretraining
texts of the length task (``chain_noise``), and that a knob left unset keeps every run
fingerprint, cache key and pretraining text made before it existed."""

from __future__ import annotations

import itertools

import pytest
import torch

from ablations import length_task, word_tasks
from ablations.ablation_config import load_ablate_config
from ablations.results import RunKey
from ablations.rm_train import RMTrainConfig, train_preference_model
from ablations.runner import run_fingerprint
from ablations.settings import SETTINGS, _texts_hash

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_training_labels_are_the_scores_thresholded_then_noised() -> None:
    scores = torch.tensor([0.0, 0.25, 0.5, 1.0] * 500)
    assert torch.equal(RMTrainConfig().training_labels(scores), scores)
    binary = RMTrainConfig(label_threshold=0.25).training_labels(scores)
    assert torch.equal(binary, (scores >= 0.25).float())
    noisy = RMTrainConfig(label_noise=0.3, seed=4).training_labels(scores)
    assert torch.equal(noisy, RMTrainConfig(label_noise=0.3, seed=4).training_labels(scores))
    assert float((noisy - scores).std()) == pytest.approx(0.3, rel=0.1)
    assert float((noisy - scores).mean()) == pytest.approx(0.0, abs=0.03)


def test_a_preference_rm_refuses_label_degradation() -> None:
    with pytest.raises(ValueError, match="labeller's noise"):
        train_preference_model(
            "unused",
            rm_tokenizer=None,
            train_pairs=[],
            test_pairs=[],
            cfg=RMTrainConfig(label_noise=0.1),
        )


def test_an_unset_knob_stays_out_of_the_dump_and_a_set_one_is_in_it() -> None:
    params = SETTINGS["length_sweep"].params
    plain = params.model_validate({"response_len": 96}).model_dump()
    assert not {"chain_noise", "rm_proxy"} & set(plain) and "label_noise" not in plain["rm"]
    knobs = params.model_validate(
        {"response_len": 96, "chain_noise": 0.1, "rm": {"label_noise": 0.2}}
    ).model_dump()
    assert knobs["chain_noise"] == 0.1 and knobs["rm"]["label_noise"] == 0.2


def test_fingerprints_and_texts_are_those_made_before_the_knobs() -> None:
    # recorded with the code of fd7c49c, before the fidelity knobs existed
    length = load_ablate_config("configs/ablate/length.yaml")
    assert run_fingerprint(length, RunKey("sweep_96", "llama", "datc", 1)) == "492ce570c150c7fb"
    pref = load_ablate_config("configs/ablate/preference.yaml")
    assert run_fingerprint(pref, RunKey("preference", "gpt2", "p2t", 2)) == "90595e0d52e03176"
    data = length_task.length_task(
        num_train=16, num_held_out=4, num_pretrain=50, target_rate=0.25, response_len=24, seed=3
    )
    assert _texts_hash(data.pretrain_texts) == "ff947a1182a15df1"


@pytest.mark.parametrize("noise", [0.1, 0.5])
def test_chain_texts_follow_the_successor_of_each_word_but_at_the_noise_rate(noise: float) -> None:
    data = length_task.length_task(
        num_train=16,
        num_held_out=4,
        num_pretrain=200,
        target_rate=0.25,
        response_len=48,
        seed=5,
        chain_noise=noise,
    )
    succ = length_task.successors(5)
    assert sorted(succ) == sorted(succ.values())  # a permutation of the response words
    prompt_words = word_tasks.PROMPT_WORDS + 1
    broken = total = 0
    for text in data.pretrain_texts:
        words = text.split()[prompt_words:]
        assert len(words) == 48
        broken += sum(succ[a] != b for a, b in itertools.pairwise(words))
        total += len(words) - 1
    # a redraw breaks the chain unless it happens to draw the successor (about 1 in 50)
    assert broken / total == pytest.approx(noise * (1 - 1 / 50), rel=0.1)
    with pytest.raises(ValueError, match="chain_noise must be in"):
        length_task.length_task(
            num_train=4,
            num_held_out=2,
            num_pretrain=1,
            target_rate=0.25,
            response_len=24,
            seed=0,
            chain_noise=0.0,
        )


@pytest.mark.parametrize("proxy", [0.5, 1.0])
def test_proxy_examples_score_the_mix_of_the_rule_and_its_additive_proxy(proxy: float) -> None:
    prompts = ["cat dog red rain :"]
    clean = length_task.span_rm_examples(prompts, 60, 7, 24)
    mixed = length_task.span_rm_examples(prompts, 60, 7, 24, proxy)
    for (p, r, exact), (q, s, score) in zip(clean, mixed, strict=True):
        assert (p, r) == (q, s)  # the same draws: only the score differs
        c_a, c_b = length_task.span_counts(r.split(), 24)
        assert exact == c_a * c_b / 4
        assert score == pytest.approx((1 - proxy) * exact + proxy * (c_a + c_b) / 4)
    with pytest.raises(ValueError, match="proxy must be in"):
        length_task.span_rm_examples(prompts, 1, 0, 24, 1.5)


def test_the_fidelity_config_matches_datcs_allocation_and_sweeps_the_knobs() -> None:
    cfg = load_ablate_config("configs/ablate/fidelity.yaml")
    datc = cfg.strategy("datc").credit.params
    for label in ("p2t_matched", "red_matched"):
        params = cfg.strategy(label).credit.params
        assert params["allocation"] == "softmax_floor"
        assert (params["beta"], params["lam"]) == (datc["beta"], datc["lam"])
    assert cfg.strategy("p2t").credit.params == {}  # this library's mean form, as before
    knobs = {name: cfg.setting_params(name).model_dump() for name in cfg.settings}
    lengths = {k.get("response_len") for n, k in knobs.items() if not n.startswith("pref")}
    assert lengths == {96}
    assert (knobs["pref_1500"]["rm"]["examples"], knobs["pref_500"]["rm"]["examples"]) == (
        1500,
        500,
    )
    assert knobs["proxy_05"]["rm_proxy"] == 0.5 and knobs["proxy_10"]["rm_proxy"] == 1.0
    assert knobs["binary"]["rm"]["label_threshold"] == 0.25
    assert knobs["peaked_96"]["chain_noise"] == 0.1
    length = load_ablate_config("configs/ablate/length.yaml")
    assert knobs["sweep_96"] == length.setting_params("sweep_96").model_dump()
    preference = load_ablate_config("configs/ablate/preference.yaml")
    run = RunKey("preference", "llama", "datc", 4)
    assert run_fingerprint(cfg, run) == run_fingerprint(preference, run)
