"""The model: Whisper's architecture (whisper.py), its dimensions (dims.py), weights from any supported format
(weights.py; CTranslate2's model.bin in ctranslate2.py), the tokenizer (tokenizer.py) and the per-slot caches the
decoder reads and writes (kv_cache.py); a model's name to its files (sources.py: no torch there, so that the command
line checks --model before it loads anything).

May import engine.kernels (the layer functions that have a fused GPU form); nothing about requests, scheduling or
devices' decode paths (those are engine.backends).
"""
