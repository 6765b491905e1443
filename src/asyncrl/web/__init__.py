"""HTTP pieces every asyncrl server uses (the inference server, the environment server, the
judge): bearer-key checks and request-body limits. Shared here so that no role imports another."""
