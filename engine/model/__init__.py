"""The model: Whisper's architecture (whisper.py) and the layer operations it runs as plain torch unless a backend
gives it others (layer_ops.py), its dimensions (dims.py), weights from any supported format
(weights.py; CTranslate2's model.bin in ctranslate2.py), the tokenizer (tokenizer.py) and the per-slot caches the
decoder reads and writes (kv_cache.py), LoRA adapters applied beside its products with an adapter per row
(lora.py); a model's name to its files (sources.py: no torch there, so that the command
line checks --model before it loads anything).

May import engine.kernels (the cross-attention cache's int8 kernels, the kernel options); nothing about requests,
scheduling or devices' decode paths (those are engine.backends, which also choose the model's layer operations).
"""
