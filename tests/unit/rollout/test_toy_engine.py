"""ToyEngine against the Hugging Face model it wraps: seeded sampling is reproducible and
batch-independent, generate and submit/step agree bit for bit, greedy is the argmax
continuation, log-probs and scores are the raw model's, weights and adapters load in place,
budgets, sample order and EOS follow VllmEngine's contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybrid.models import TinyModelConfig, build_tiny_model
from hybrid.models.tokenizer import EOS_TOKEN, EOS_TOKEN_ID
from hybrid.rollout.base import GREEDY, Continuation, GeneratedSample, Sampling
from hybrid.rollout.config import RolloutConfig
from hybrid.rollout.engines import make_engine as make_rollout_engine
from hybrid.rollout.toy_engine import (
    SamplingSettings,
    ToyEngine,
    filter_top_k_top_p,
    sample_token,
)

pytestmark = pytest.mark.unit

PROMPTS = [[5, 17, 40, 99], [7, 8], [120, 121, 122, 123, 124, 125]]
SEEDS = [11, 22, 33]
INF = float("inf")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("toy") / "text", seed=0)


@pytest.fixture(scope="module")
def arithmetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 token ids: EOS comes up often enough to test stopping."""
    config = TinyModelConfig.preset("tiny", vocab="arithmetic")
    return build_tiny_model(tmp_path_factory.mktemp("toy") / "arithmetic", config, seed=0)


def make_engine(model_dir: Path, lora_rank: int = 0, **rollout: object) -> ToyEngine:
    settings: dict[str, object] = {"engine": "toy", "response_length": 16, **rollout}
    config = RolloutConfig(**settings)  # type: ignore[arg-type]  # test overrides, any field
    return ToyEngine(str(model_dir), config, torch.device("cpu"), "float32", lora_rank=lora_rank)


def hf_model(model_dir: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def hf_log_softmax(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """(len - 1, vocab): the raw next-token distribution after each prefix, one full forward."""
    logits = model(input_ids=torch.tensor([sequence])).logits[0, :-1]
    return logits.float().log_softmax(dim=-1)


def tokens(samples: list[GeneratedSample]) -> list[list[int]]:
    return [s.token_ids for s in samples]


def stream(engine: ToyEngine, requests: dict[str, Continuation]) -> dict[str, GeneratedSample]:
    """Submit `requests`, step until none is left; each step must add one token to every
    unfinished request, and each request finishes once."""
    for request_id, request in requests.items():
        engine.submit(request_id, request)
    got: dict[str, tuple[list[int], list[float]]] = {rid: ([], []) for rid in requests}
    done: dict[str, bool] = {}
    while engine.has_unfinished():
        unfinished = set(requests) - set(done)
        outputs = engine.step()
        assert {rid for rid, _, _ in outputs} == unfinished
        for request_id, delta, finished in outputs:
            assert len(delta.token_ids) == len(delta.log_probs) == 1
            got[request_id][0].extend(delta.token_ids)
            got[request_id][1].extend(delta.log_probs)
            assert delta.stopped <= finished
            if finished:
                done[request_id] = delta.stopped
    return {rid: GeneratedSample(ids, lps, "", done[rid]) for rid, (ids, lps) in got.items()}


# --- sampling math ---------------------------------------------------------------------------


def test_top_k_keeps_the_k_largest_and_their_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0])
    assert filter_top_k_top_p(logits, 2, 1.0).tolist() == [-INF, 3.0, -INF, 3.0, -INF]
    assert filter_top_k_top_p(logits, 3, 1.0).tolist() == [-INF, 3.0, 2.0, 3.0, -INF]
    assert filter_top_k_top_p(logits, -1, 1.0) is logits
    assert filter_top_k_top_p(logits, 9, 1.0).tolist() == logits.tolist()


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    logits = torch.tensor([0.1, 0.4, 0.2, 0.3]).log()
    kept = lambda p: (filter_top_k_top_p(logits, -1, p) > -INF).tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, True]
    assert kept(0.8) == [False, True, True, True]
    assert kept(1e-6) == [False, True, False, False]
    # top-k first, then top-p over what is left, renormalised: 0.3 / 0.7 < 1 - 0.5 drops the
    # 0.3 that top-p alone would keep.
    both = filter_top_k_top_p(logits, 2, 0.5) > -INF
    assert both.tolist() == [False, True, False, False]


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_sampling_follows_the_tempered_probabilities_and_the_generator(
    temperature: float,
) -> None:
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    settings = SamplingSettings(temperature, top_k=-1, top_p=1.0, ignore_eos=False)
    generator = torch.Generator().manual_seed(0)
    draws = [sample_token(logits, settings, generator) for _ in range(4000)]
    frequencies = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    assert torch.allclose(frequencies, (logits / temperature).softmax(-1), atol=0.03)
    again = torch.Generator().manual_seed(0)
    assert [sample_token(logits, settings, again) for _ in range(50)] == draws[:50]
    greedy = SamplingSettings(temperature=0.0, top_k=-1, top_p=1.0, ignore_eos=False)
    assert sample_token(logits, greedy, generator) == 1


# --- generation ------------------------------------------------------------------------------


def test_same_seed_same_tokens_different_seeds_differ(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=2, ignore_eos=True)
    first = engine.generate(PROMPTS, seeds=SEEDS)
    assert len(first) == len(PROMPTS) * 2
    assert tokens(make_engine(model_dir, n=2, ignore_eos=True).generate(PROMPTS, seeds=SEEDS)) == (
        tokens(first)
    )
    assert tokens(engine.generate(PROMPTS, seeds=SEEDS)) == tokens(first)  # no history
    other = engine.generate(PROMPTS, seeds=[s + 100 for s in SEEDS])
    assert all(a != b for a, b in zip(tokens(first), tokens(other), strict=True))
    assert first[0].token_ids != first[1].token_ids  # the two samples of a prompt differ


def test_sample_j_is_seeded_with_the_prompt_seed_plus_j(model_dir: Path) -> None:
    pairs = make_engine(model_dir, n=2, ignore_eos=True).generate(PROMPTS, seeds=SEEDS)
    single = make_engine(model_dir, n=1, ignore_eos=True)
    for i, (prompt, seed) in enumerate(zip(PROMPTS, SEEDS, strict=True)):
        for j in range(2):
            alone = single.generate([prompt], seeds=[seed + j])[0]
            assert alone.token_ids == pairs[2 * i + j].token_ids
            assert alone.log_probs == pairs[2 * i + j].log_probs


def test_a_rows_samples_do_not_depend_on_its_batch(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=2)
    batch = engine.generate(PROMPTS, seeds=SEEDS, max_tokens=[4, 9, 16])
    alone = engine.generate([PROMPTS[1]], seeds=[SEEDS[1]], max_tokens=[9])
    assert alone == batch[2:4]


def test_unseeded_requests_follow_the_engine_seed(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=2, ignore_eos=True, seed=5)
    first = tokens(engine.generate(PROMPTS))
    second = tokens(engine.generate(PROMPTS))
    assert tokens(make_engine(model_dir, n=2, ignore_eos=True, seed=5).generate(PROMPTS)) == first
    assert second != first
    assert tokens(make_engine(model_dir, n=2, ignore_eos=True, seed=6).generate(PROMPTS)) != first
    # Request seeds switched off: the row seeds are ignored, like vLLM's engine-seeded mode.
    unseeded = make_engine(model_dir, n=2, ignore_eos=True, seed=5, seed_requests=False)
    assert tokens(unseeded.generate(PROMPTS, seeds=SEEDS)) == first


def test_generate_equals_the_submit_step_stream(model_dir: Path) -> None:
    budgets = [5, 9, 16]
    engine = make_engine(model_dir, n=2)
    generated = engine.generate(PROMPTS, seeds=SEEDS, max_tokens=budgets)
    requests = {
        f"{i}-{j}": Continuation(prompt, budget, seed + j)
        for i, (prompt, seed, budget) in enumerate(zip(PROMPTS, SEEDS, budgets, strict=True))
        for j in range(2)
    }
    streamed = stream(make_engine(model_dir), requests)
    for index, request_id in enumerate(requests):
        want = generated[index]
        assert streamed[request_id].token_ids == want.token_ids
        assert streamed[request_id].log_probs == want.log_probs
        assert streamed[request_id].stopped == want.stopped


def test_abort_drops_requests_and_duplicates_are_refused(model_dir: Path) -> None:
    engine = make_engine(model_dir, ignore_eos=True)
    assert not engine.has_unfinished()
    engine.submit("a", Continuation(PROMPTS[0], 8, 1))
    engine.submit("b", Continuation(PROMPTS[1], 8, 2))
    with pytest.raises(ValueError, match="'a' is already"):
        engine.submit("a", Continuation(PROMPTS[0], 8, 1))
    assert [rid for rid, _, _ in engine.step()] == ["a", "b"]
    engine.abort(["a", "unknown"])
    assert [rid for rid, _, _ in engine.step()] == ["b"]
    engine.abort(["b"])
    assert not engine.has_unfinished()
    assert engine.step() == []


def test_greedy_is_the_argmax_continuation(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=3, temperature=0.9, top_k=5)
    greedy = engine.generate(PROMPTS, sampling=GREEDY, seeds=SEEDS, max_tokens=[6, 6, 6])
    assert len(greedy) == len(PROMPTS)  # one sample per prompt, whatever n
    model = hf_model(model_dir)
    for prompt, sample in zip(PROMPTS, greedy, strict=True):
        sequence = list(prompt)
        for _ in range(6):
            sequence.append(int(hf_log_softmax(model, [*sequence, 0])[-1].argmax()))
            if sequence[-1] == EOS_TOKEN_ID:
                break
        assert sample.token_ids == sequence[len(prompt) :]


def test_a_call_s_own_sampling_replaces_the_rollout_s(model_dir: Path) -> None:
    """Validation's n, temperature and top-p instead of the rollout's (top-k off, EOS stops)."""
    validation = Sampling(n=2, temperature=0.7, top_p=0.9)
    training = make_engine(model_dir, n=4, temperature=1.0, top_k=3, ignore_eos=True)
    own = training.generate(PROMPTS, sampling=validation, seeds=SEEDS)
    alike = make_engine(model_dir, n=2, temperature=0.7, top_p=0.9)
    assert len(own) == 2 * len(PROMPTS)
    assert tokens(own) == tokens(alike.generate(PROMPTS, seeds=SEEDS))


def test_log_probs_are_the_raw_models_at_the_sampled_tokens(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=2, temperature=0.7, top_k=20, top_p=0.9)
    samples = engine.generate(PROMPTS, seeds=SEEDS)
    model = hf_model(model_dir)
    processed_gap = 0.0
    for index, sample in enumerate(samples):
        prompt = PROMPTS[index // 2]
        raw = hf_log_softmax(model, prompt + sample.token_ids)[len(prompt) - 1 :]
        picked = raw.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(sample.log_probs), picked, atol=1e-5, rtol=0)
        # Every sampled token is among the 20 most likely ones: top-k was applied.
        ranks = (raw > picked[:, None]).sum(dim=1)
        assert int(ranks.max()) < 20
        processed = (
            (raw / 0.7).log_softmax(dim=-1).gather(1, torch.tensor(sample.token_ids)[:, None])
        )
        processed_gap = max(processed_gap, float((processed[:, 0] - picked).abs().max()))
    assert processed_gap > 1e-2  # raw, not the tempered distribution


def test_top_k_1_and_a_tiny_top_p_sample_the_argmax(model_dir: Path) -> None:
    greedy = tokens(make_engine(model_dir).generate(PROMPTS, sampling=GREEDY))
    assert tokens(make_engine(model_dir, top_k=1).generate(PROMPTS, seeds=SEEDS)) == greedy
    assert tokens(make_engine(model_dir, top_p=1e-6).generate(PROMPTS, seeds=SEEDS)) == greedy
    assert tokens(make_engine(model_dir).generate(PROMPTS, seeds=SEEDS)) != greedy


def test_budgets_per_prompt_and_prompt_major_order(model_dir: Path) -> None:
    engine = make_engine(model_dir, n=3, ignore_eos=True)
    samples = engine.generate(PROMPTS, seeds=SEEDS, max_tokens=[2, 5, 3])
    assert [len(s.token_ids) for s in samples] == [2, 2, 2, 5, 5, 5, 3, 3, 3]
    assert [len(s.log_probs) for s in samples] == [2, 2, 2, 5, 5, 5, 3, 3, 3]
    assert not any(s.stopped for s in samples)
    assert {len(s.token_ids) for s in engine.generate(PROMPTS)} == {16}  # response_length
    with pytest.raises(ValueError, match=r"rollout\.max_model_len=512"):
        engine.generate([[5] * 512])


def test_eos_stops_unless_ignored(arithmetic_dir: Path) -> None:
    prompts = [[4, 5, 6], [7, 8], [9, 10, 11, 12]]
    stopping = make_engine(arithmetic_dir, n=4, response_length=32)
    samples = stopping.generate(prompts, seeds=SEEDS)
    assert any(s.stopped for s in samples)
    tokenizer = stopping.tokenizer
    for sample in samples:
        assert sample.stopped == (sample.token_ids[-1] == EOS_TOKEN_ID)
        assert EOS_TOKEN_ID not in sample.token_ids[:-1]
        assert sample.stopped or len(sample.token_ids) == 32
        assert sample.text == tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        assert EOS_TOKEN not in sample.text
    ignoring = make_engine(arithmetic_dir, n=4, response_length=32, ignore_eos=True)
    through = ignoring.generate(prompts, seeds=SEEDS)
    assert all(len(s.token_ids) == 32 and not s.stopped for s in through)
    assert any(EOS_TOKEN_ID in s.token_ids for s in through)
    for stopped, continued in zip(samples, through, strict=True):
        assert continued.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    # Greedy stops at EOS even under ignore_eos (VllmEngine's greedy requests do). The tied
    # tiny model's argmax repeats the last token, so a prompt ending in EOS yields EOS first.
    greedy = ignoring.generate([[4, 5, EOS_TOKEN_ID], [4, 5]], sampling=GREEDY)
    assert [(s.token_ids, s.stopped) for s in greedy] == [([EOS_TOKEN_ID], True), ([5] * 32, False)]


# --- scoring and weights ---------------------------------------------------------------------


def test_score_is_the_models_log_prob_of_each_token(model_dir: Path) -> None:
    sequences = [*PROMPTS, [3]]
    scores = make_engine(model_dir).score(sequences)
    assert [len(s) for s in scores] == [len(s) - 1 for s in sequences]
    model = hf_model(model_dir)
    for sequence, score in zip(sequences[:-1], scores[:-1], strict=True):
        want = hf_log_softmax(model, sequence).gather(1, torch.tensor(sequence[1:])[:, None])
        assert torch.allclose(torch.tensor(score), want[:, 0], atol=1e-5, rtol=0)


def test_load_weights_writes_in_place(model_dir: Path) -> None:
    engine = make_engine(model_dir, ignore_eos=True)
    before_tokens = tokens(engine.generate(PROMPTS, seeds=SEEDS))
    before_scores = engine.score(PROMPTS)
    embedding = dict(engine.stored_weights())["model.embed_tokens.weight"]
    generator = torch.Generator().manual_seed(3)
    perturbed = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in hf_model(model_dir).state_dict().items()
        if name != "lm_head.weight"  # tied: the embedding carries it
    }
    engine.load_weights(perturbed.items())
    assert dict(engine.stored_weights())["model.embed_tokens.weight"] is embedding
    assert torch.equal(embedding, perturbed["model.embed_tokens.weight"])
    reference = hf_model(model_dir)
    reference.load_state_dict(perturbed, strict=False)
    for sequence, score in zip(PROMPTS, engine.score(PROMPTS), strict=True):
        want = hf_log_softmax(reference, sequence).gather(1, torch.tensor(sequence[1:])[:, None])
        assert torch.allclose(torch.tensor(score), want[:, 0], atol=1e-5, rtol=0)
    assert engine.score(PROMPTS) != before_scores
    assert tokens(engine.generate(PROMPTS, seeds=SEEDS)) != before_tokens
    # The tied head by its own name lands in the shared embedding.
    engine.load_weights([("lm_head.weight", torch.zeros_like(embedding))])
    assert not embedding.any()
    with pytest.raises(KeyError, match=re.escape("model.layers.9.mlp.up_proj.weight")):
        engine.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*\(3,\)"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])


def write_adapter(model_dir: Path, directory: Path, seed: int) -> torch.nn.Module:
    """A rank-4 peft adapter on q/v with non-zero weights; returns the peft model."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(hf_model(model_dir), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    peft_model.save_pretrained(str(directory))
    return peft_model.eval()


def test_adapter_serves_requests_and_the_base_stays_scorable(
    model_dir: Path, tmp_path: Path
) -> None:
    engine = make_engine(model_dir, lora_rank=8)
    base = hf_model(model_dir)
    base_scores = engine.score(PROMPTS)

    def expect(scores: list[list[float]], model: torch.nn.Module) -> None:
        for sequence, score in zip(PROMPTS, scores, strict=True):
            want = hf_log_softmax(model, sequence).gather(1, torch.tensor(sequence[1:])[:, None])
            assert torch.allclose(torch.tensor(score), want[:, 0], atol=1e-5, rtol=0)

    first = write_adapter(model_dir, tmp_path / "adapter", seed=1)
    engine.load_adapter(tmp_path / "adapter")
    expect(engine.score(PROMPTS), first)
    expect(engine.score(PROMPTS, with_adapter=False), base)
    assert engine.score(PROMPTS) != base_scores
    # Generation runs with the adapter: its raw log-probs are the adapted model's.
    sample = engine.generate([PROMPTS[0]], seeds=[1])[0]
    raw = hf_log_softmax(first, PROMPTS[0] + sample.token_ids)[len(PROMPTS[0]) - 1 :]
    picked = raw.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(sample.log_probs), picked, atol=1e-5, rtol=0)
    # A new adapter in the same directory replaces the old one in place.
    second = write_adapter(model_dir, tmp_path / "adapter", seed=2)
    engine.load_adapter(tmp_path / "adapter")
    expect(engine.score(PROMPTS), second)
    # The base still loads by Hugging Face name under the adapter's wrappers.
    norm = hf_model(model_dir).get_parameter("model.norm.weight") * 2
    engine.load_weights([("model.norm.weight", norm)])
    assert engine.score(PROMPTS, with_adapter=False) != base_scores
    with pytest.raises(ValueError, match="lora_rank=0"):
        make_engine(model_dir).load_adapter(tmp_path / "adapter")
    with pytest.raises(ValueError, match="rank 4, above the engine's lora_rank"):
        make_engine(model_dir, lora_rank=2).load_adapter(tmp_path / "adapter")


# --- construction and lifecycle ----------------------------------------------------------------


def test_the_factory_builds_it_with_vllm_engines_arguments(model_dir: Path) -> None:
    config = RolloutConfig(engine="toy", response_length=4)
    engine = make_rollout_engine(str(model_dir), config, torch.device("cpu"), "float32", 0, None)
    assert isinstance(engine, ToyEngine)
    assert [len(s.token_ids) for s in engine.generate(PROMPTS, seeds=SEEDS)] == [4, 4, 4]


def test_tensor_parallelism_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size must be 1, got 2"):
        make_engine(model_dir, tensor_parallel_size=2)


def test_works_beside_a_process_group(model_dir: Path, tmp_path: Path) -> None:
    import torch.distributed as dist

    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
        )
    try:
        engine = make_engine(model_dir)
        assert len(engine.generate(PROMPTS, seeds=SEEDS)) == len(PROMPTS)
    finally:
        if started_here:
            dist.destroy_process_group()


def test_memory_verbs_and_shutdown(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    facts = engine.configure_loads("auto")
    assert (facts.strategy, facts.layout, facts.apart, engine.dtype) == (
        "reload",
        "plain",
        (),
        "float32",
    )
    engine.release()
    engine.resume(["weights", "kv_cache"])
    engine.reset_prefix_cache()
    assert engine.resident == {"weights", "kv_cache"}
    assert len(engine.generate(PROMPTS, seeds=SEEDS)) == len(PROMPTS)
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.score(PROMPTS)
