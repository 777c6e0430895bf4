"""Everything a deployment needs: preprocessing, backends, the Predictor. Never imports export/."""
