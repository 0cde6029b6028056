"""The folder `trainfast ablate -- COMMAND` puts first on PYTHONPATH: its sitecustomize installs the probe."""
