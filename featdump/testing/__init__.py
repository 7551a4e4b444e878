"""What featdump gives the authors of its plugins to test them with: `featdump.testing.readers.ReaderConformance`,
the checks a reader must pass (subclassed in the plugin's own tests, as pandas' `tests.extension.base` is), and
`featdump.testing.models`, the small model they run (no weights to download)."""
