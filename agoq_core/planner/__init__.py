"""DBCA-PP planner: pipeline-stage-aware activation formats (filled in as the package grows)."""
