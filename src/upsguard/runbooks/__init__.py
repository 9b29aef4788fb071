"""Planning only: the resource graph, ordering, the schedule, plans and their rendering.
Nothing here talks to a platform or waits: ``engine`` carries plans out."""
