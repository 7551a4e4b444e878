"""Forward: a model's forward pass, and the layer outputs taken from it. `probe` runs dry forwards (`meta`: on the
meta device) to learn every module's calls, shapes and batch dimension; `patterns` and `layers` turn --layers
selectors into validated Layers; `hooks` captures their outputs (a copy at hook time, the forward stopped after the
last one), or `graph`'s traced copy of the forward that computes only what the layers need; `compiling` compiles
that graph; `device` and `memory_format` place the model and its inputs for the forward."""
