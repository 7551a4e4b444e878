"""Units: what each unit of a stored layer answers to (`top`: its highest and lowest images, out of core)."""
