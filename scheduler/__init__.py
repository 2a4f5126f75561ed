"""The scheduler: the controller that reconciles replicas toward the desired state."""
