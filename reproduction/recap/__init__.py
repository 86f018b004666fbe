"""The four RECAP stages as plain functions and models: returns, value, advantages, policy."""
