"""Getting a warmup and its serving pods onto a cluster: Ray job submission and Kubernetes
manifests (KubeRay's RayJob, a Deployment)."""
