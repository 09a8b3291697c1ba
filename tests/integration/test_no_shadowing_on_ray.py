"""Ray's workers (the replicas among them) import nothing from the checkout, though Ray gives
them the driver's working directory to import from (cluster/ray_driver.py)."""

from pdserve.tests.ray_cluster import SessionCluster


def test_a_worker_of_the_session_imports_nothing_from_the_checkout(
    ray_cluster: SessionCluster,
) -> None:
    import ray

    from pdserve.tests.shadowing import shadowing

    assert ray.get(ray.remote(shadowing).options(num_cpus=0).remote(), timeout=120) == []
