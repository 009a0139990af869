"""The console: what every page of it shares (`shared`) and the registry of the actions a person
takes on a task or on one of its operations (`actions`). It sits above the apps it shows."""
