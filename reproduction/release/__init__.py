"""Control plane: manifest, digests, archives, relocation, pack, verify, restore, hub."""
