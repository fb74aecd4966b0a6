"""The teachers' embeddings that mined negatives and ranking distillation are made from: on a run
on Ray, a pool of Ray Data actors makes them, once per teacher whichever ingredients need them (a
training checkpoint as teacher is resolved by the platform to its model and evaluation pooler),
and what the run's corpus statistics hold is what the same teachers make in one process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from methods.encoder import Encoder
from methods.mined import MinedParams, mine
from methods.recipe import Recipe
from methods.rankcse import embed_rows
from methods.teachers import Teacher


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from platform.run.ray_env import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.mark.e2e
def test_a_run_on_ray_makes_the_teachers_statistics_on_ray_data_as_one_process_would(local_ray, small_corpus,
                                                                                     tiny_model, tmp_path):
    from platform.data.columns import prepare_corpus

    sentences = [s for s in small_corpus.read_text(encoding="utf-8").splitlines() if s.strip()][:60]
    sentences += sentences[:5]  # repeated rows: one embedding each, every row its vector
    checkpoint = tmp_path / "checkpoint"  # a training checkpoint of this platform, as a teacher
    Encoder.from_pretrained(str(tiny_model), pooler="avg").save_pretrained(checkpoint / "model")
    (checkpoint / "state.json").write_text(json.dumps({"eval_pooler": "avg", "step": 10}))
    recipe = Recipe.named("simcse", negatives="mined", mine_range_max=20, aux="rank_distill",
                          rank_teachers=f"minilm,{checkpoint}")

    on_ray = prepare_corpus(recipe, sentences, use_ray=True).statistics

    from ray.util.state import list_actors

    # A pool per teacher (of one actor: one block of sentences), the checkpoint's, and MiniLM's once
    # for both ingredients.
    pools = list_actors(address=local_ray.get_runtime_context().gcs_address, limit=100,
                        filters=[("class_name", "=", "MapWorker(MapBatches(Teacher))")])
    assert len(pools) == 2, pools

    here = Teacher(str(checkpoint / "model"), pooler="avg")
    want = [embed_rows(sentences, "minilm"), embed_rows(sentences, "x", lambda texts, _: here.encode(texts))]
    got = on_ray["rank_distill"]
    assert [g.shape for g in got] == [(len(sentences), 384), (len(sentences), here.encode(["a"]).shape[1])]
    for g, w in zip(got, want):
        assert g.dtype == np.float16 and np.allclose(np.asarray(g, np.float32), w.astype(np.float32), atol=2e-3)
        assert (np.asarray(g[:5]) == np.asarray(g[-5:])).all()
    kept = mine(sentences, MinedParams(mine_range_max=20))
    assert on_ray["mined"].keys() == kept.keys() and len(kept) > 50
    same = sum(on_ray["mined"][s] == k for s, k in kept.items())
    assert same >= 0.95 * len(kept), same  # the rest: neighbours swapped by round-off at a tie


@pytest.mark.e2e
def test_a_teacher_pool_asks_ray_for_the_memory_its_actors_use(local_ray, small_corpus, capfd):
    """With a fractional ``augment_cpus`` (the local profile's 0.2) Ray would place five teachers
    on a CPU by their CPUs alone; each actor asks for its memory, which covers what it uses (Ray
    Data's detector, checked every second here, says nothing), and loads its model without a
    progress bar on the run's console."""
    import ray.data
    from ray.util.state import list_actors

    from platform.data.pipeline import actor_memory, embed

    def pools():
        return list_actors(address=local_ray.get_runtime_context().gcs_address, limit=100, detail=True,
                           filters=[("class_name", "=", "MapWorker(MapBatches(Teacher))")])

    before = {a.actor_id for a in pools()}  # other tests' pools in this Ray session
    sentences = [s for s in small_corpus.read_text(encoding="utf-8").splitlines() if s.strip()] * 4
    detector = ray.data.DataContext.get_current().issue_detectors_config.high_memory_detector_config
    interval, detector.detection_time_interval_s = detector.detection_time_interval_s, 1
    try:
        vectors = embed(sentences, "minilm", use_ray=True, cpus=0.2)
    finally:
        detector.detection_time_interval_s = interval
    assert vectors.shape == (len(sentences), 384)
    asked = {a.required_resources.get("memory") for a in pools() if a.actor_id not in before}
    assert asked == {actor_memory("minilm")} and 1.0e9 < asked.pop() < 1.5e9, asked
    out = capfd.readouterr()
    assert "of memory per worker" not in out.out + out.err, out.err
    assert "Loading weights" not in out.out + out.err, out.err


def test_a_models_weight_files_are_what_it_loads(tmp_path):
    """A sentence-transformers folder's safetensors (its modules' too), not its ONNX or OpenVINO
    exports; PyTorch's files where it has no safetensors."""
    from platform.data.pipeline import weight_bytes

    model = tmp_path / "st"
    for name, size in (("model.safetensors", 300), ("2_Dense/model.safetensors", 20), ("onnx/model.onnx", 5000),
                       ("openvino/openvino_model.bin", 7000), ("pytorch_model.bin", 900), ("config.json", 10)):
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes(b"\0" * size)
    assert weight_bytes(str(model)) == 320
    old = tmp_path / "old"
    (old / "1_Pooling").mkdir(parents=True)
    (old / "pytorch_model.bin").write_bytes(b"\0" * 900)
    (old / "1_Pooling" / "config.json").write_bytes(b"\0" * 50)
    assert weight_bytes(str(old)) == 900
