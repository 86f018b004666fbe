"""The embedded default: MuJoCo Fetch tasks, scripted experts, data generation, policy eval."""
