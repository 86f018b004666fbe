"""Control plane: accelerator, compile toolchain and hazard probes behind `portable check`."""
