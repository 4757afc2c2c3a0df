"""Models and the processes that hold them: loading (local, hub, GGUF), the built-in tiny model, torchrun and FSDP."""
