"""The shipped recipes (*.toml here), installed as the data package mxlab.recipe.shipped; see mxlab.recipe.library."""
