#!/usr/bin/env python3
# Benchmark helper (bench/llama_cpp_side_by_side.sh): writes a `chunkpipe make-model` checkpoint
# (DeepSeek-V3 layout, BF16 safetensors) as a llama.cpp `deepseek2` GGUF with the same BF16
# weights, and a vocabulary cut from the real DeepSeek-V3 tokenizer.json to the model's size
# (ids below vocab_size and the merges among them). MTP layers are skipped, as llama.cpp's own
# converter does. Needs numpy (Debian: python3-numpy, python3-sentencepiece) and llama.cpp's
# gguf-py (LLAMA_CPP_DIR). Usage: deepseek_to_gguf.py MODEL_DIR TOKENIZER_JSON OUT.gguf
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.environ.get("LLAMA_CPP_DIR", "."), "gguf-py"))
import gguf  # noqa: E402

model_dir, tok_path, out_path = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cfg = json.loads((model_dir / "config.json").read_text())
L = cfg["num_hidden_layers"]
V = cfg["vocab_size"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a: base + b]
        dt = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}[info["dtype"]]
        out[name] = (info["dtype"], raw.view(dt).reshape(info["shape"]))
    return out


tensors = {}
for p in sorted(model_dir.glob("*.safetensors")):
    tensors.update(read_safetensors(p))

arch = gguf.MODEL_ARCH.DEEPSEEK2
w = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[arch])
w.add_block_count(L)
w.add_context_length(cfg["max_position_embeddings"])
w.add_embedding_length(cfg["hidden_size"])
w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(cfg["num_attention_heads"])
w.add_head_count_kv(cfg["num_key_value_heads"])
w.add_rope_freq_base(cfg["rope_theta"])
w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
w.add_expert_count(cfg["n_routed_experts"])
w.add_expert_used_count(cfg["num_experts_per_tok"])
w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
w.add_vocab_size(V)
if cfg.get("q_lora_rank"):
    w.add_q_lora_rank(cfg["q_lora_rank"])
w.add_kv_lora_rank(cfg["kv_lora_rank"])
w.add_key_length(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
w.add_value_length(cfg["v_head_dim"])
w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
w.add_expert_shared_count(cfg["n_shared_experts"])
w.add_expert_weights_scale(cfg["routed_scaling_factor"])
w.add_expert_weights_norm(cfg["norm_topk_prob"])
w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg["scoring_func"] == "sigmoid"
                         else gguf.ExpertGatingFuncType.SOFTMAX)
w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
rs = cfg.get("rope_scaling")
if rs and rs.get("type") == "yarn":
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rs["factor"])
    w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])

# The vocabulary: the real tokenizer's first V ids, and the merges among them.
tok = json.loads(Path(tok_path).read_text())
vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < V}
added = {a["id"]: a for a in tok.get("added_tokens", [])}
tokens = [f"[PAD{i}]" for i in range(V)]
types = [gguf.TokenType.UNUSED] * V
for t, i in vocab.items():
    tokens[i] = t
    types[i] = gguf.TokenType.NORMAL
for i, a in added.items():
    if i < V:
        tokens[i] = a["content"]
        types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
merges = []
for m in tok["model"]["merges"]:
    a, b = m.split(" ", 1) if isinstance(m, str) else m
    if a in vocab and b in vocab and (a + b) in vocab:
        merges.append(f"{a} {b}")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("deepseek-v3")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_bos_token_id(0)
w.add_eos_token_id(1)
w.add_add_bos_token(True)

names = gguf.get_tensor_name_map(arch, L)


def add(name, dtype, arr):
    if dtype == "BF16":
        w.add_tensor(name, np.ascontiguousarray(arr), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(name, np.ascontiguousarray(arr.astype(np.float32)))


experts = {}
for hf, (dtype, arr) in tensors.items():
    parts = hf.split(".")
    if hf.startswith("model.layers.") and int(parts[2]) >= L:
        continue  # MTP layers
    if ".mlp.experts." in hf:
        bid, xid, proj = int(parts[2]), int(parts[5]), parts[6]
        experts.setdefault((bid, proj), {})[xid] = (dtype, arr)
        continue
    key = hf.replace("e_score_correction_bias", "e_score_correction.bias")
    new = names.get_name(key, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise SystemExit(f"no GGUF name for {hf}")
    if arr.ndim == 1 and dtype == "BF16":  # norms and biases as F32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
        dtype = "F32"
    add(new, dtype, arr)
for (bid, proj), by_id in sorted(experts.items()):
    dtype = by_id[0][0]
    stacked = np.stack([by_id[x][1] for x in range(len(by_id))])
    new = names.get_name(f"model.layers.{bid}.mlp.experts.{proj}.weight", try_suffixes=(".weight",))
    add(new, dtype, stacked)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", out_path)
