"""`localspec bench`: modes run side by side on a prompt suite, and the policy replay."""
