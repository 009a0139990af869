"""The permissions of the engine's app, named once: the console, the API, the admin and the
catalogue check these names. `Connection.Meta` declares `manage_connections`, `ToolServer.Meta`
`manage_toolservers`; the others are Django's default model permissions."""

# Add, change and test connections, their models and prices.
MANAGE_CONNECTIONS = "agents.manage_connections"
VIEW_CONNECTION = "agents.view_connection"
# Who may see the connections: who manages them, and who only looks.
VIEW_CONNECTIONS_PERMS = (MANAGE_CONNECTIONS, VIEW_CONNECTION)

# Register, test and remove MCP tool servers.
MANAGE_TOOLSERVERS = "agents.manage_toolservers"

# How the models did: the scorecard, the evaluation page, the workers page.
VIEW_AGENTRUN = "agents.view_agentrun"
