"""REST API of the controller (FastAPI); talks to the service facade only."""
