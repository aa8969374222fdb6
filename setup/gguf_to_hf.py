"""Converts a GGUF checkpoint into a Hugging Face model directory that `vllm serve` loads.

Run by `servetune setup vllm` with the vLLM venv's Python (it has torch, transformers, gguf and
accelerate), offline. Usage: gguf_to_hf.py MODEL.gguf OUT_DIR

transformers reads the GGUF, dequantizes every tensor to bf16 as it loads and rebuilds the
tokenizer from the GGUF's vocabulary; the result is saved as safetensors with the tokenizer's
files next to it, and the model class is written into config.json's `architectures` (vLLM picks
its implementation from that field; a GGUF carries none).
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf_path, out = sys.argv[1], sys.argv[2]
folder, name = os.path.split(os.path.abspath(gguf_path))
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
# The tensors are plain bf16 now, but transformers keeps the GGUF quantizer attached, and that
# quantizer refuses to save; drop the marker.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
os.makedirs(out, exist_ok=True)
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
config_path = os.path.join(out, "config.json")
with open(config_path) as f:
    config = json.load(f)
config["architectures"] = [type(model).__name__]
with open(config_path, "w") as f:
    json.dump(config, f, indent=2)
print(json.dumps({"architectures": config["architectures"], "vocab_size": config.get("vocab_size")}))
