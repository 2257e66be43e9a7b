"""Training MaxK-GNN models from configs (being assembled; see ARCHITECTURE.md)."""
