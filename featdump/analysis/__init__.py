"""Analysis: what is computed from stored features, out of core: `gram` accumulates a layer's Gram statistics over
slabs of its features within a memory budget, `rdm` turns them into RDMs, `cka` compares layers (of one output or
two) by centred kernel alignment; `stored` reads an output as they need it, `results` writes their resumable file,
`faces/matrices.py` draws them; `gram` also gives the read-outs (`featdump.readout`) their Gram."""
