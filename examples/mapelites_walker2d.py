"""MAP-Elites on brax's walker2d: a gait for every way of using the two feet.

    python examples/mapelites_walker2d.py [--generations 30] [--devices 2]

The task qd/walker2d_uni: each candidate is a 16 x 16 MLP policy scored on one
100-step episode (the spring backend), its descriptor the proportion of the
steps on which each foot touches the ground. A CVT archive of 256 cells over
that square, 32 candidates per generation by isoline variation, the archive
sharded across the devices by cell. Writes the run folder
runs/examples/mapelites-walker2d (archive.npz; archive.png, the heat map of the
elites; qd.png, the QD-score and coverage curves) and figures/mapelites_walker2d.png:
the heat map and both curves beside the batches' fitness.

Expected outcome (seed 0, one device, 30 generations, 992 evaluations): coverage
33.6% of the 256 cells and QD-score 24,029 (generation 1: 12.1% and 7,087), the
best return 215; about 1.5 minutes on 2 cores, most of it compiling brax's step
(about 35 s once the compilation cache holds it).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=30)

from evorl_pop.algorithms.mapelites import MapElitesConfig  # noqa: E402
from evorl_pop.run import plotting  # noqa: E402

config = MapElitesConfig(
    task="qd/walker2d_uni",
    population_size=32,
    archive="cvt",
    num_cells=256,
    cvt_samples=10_000,
    hidden_sizes=(16, 16),
    episode_length=100,
    backend="spring",
)
out = args.figures / "mapelites_walker2d.png"
result = script.train(
    args,
    {"mapelites-walker2d": config},
    out.name,
    "MAP-Elites, qd/walker2d_uni, 32 candidates per generation",
    chunk=10,
    checkpoint_every=0,
)["mapelites-walker2d"]


# The run folder's heat map and QD curves (MapElites.export) and the batches' fitness
# (script.train's figure), drawn by the project's plotting and joined into one figure.
plotting.join_images([[result.run_dir / "archive.png", out], [result.run_dir / "qd.png"]], out)

history = result.history
print(
    f"coverage {history['coverage'][-1]:.1%} of {config.num_cells} cells, QD-score "
    f"{history['qd_score'][-1]:.6g}, best return {history['archive_fitness_max'][-1]:.4g}; "
    f"the figure: {out}"
)
