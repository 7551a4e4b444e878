"""Test makers: what the tests (and the benchmarks, which import them from here) make to run on: images, camera
photos, films, featdump outputs, tiny models, faults injected into a run, a SeaweedFS store on loopback."""
