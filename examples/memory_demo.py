# ipybox demo: agent-style code that calls the tools of an MCP server (server-memory) through
# the typed Python API that `ipybox apigen` generated in mcptools/memory/.
from mcptools.memory import create_entities as ce, create_relations as cr, search_nodes as sn

people = {"Ada": "mathematician, wrote the first program", "Charles": "engineer, designed the Analytical Engine"}
ce.run(ce.Params(entities=[
    ce.EntitiesItem(name=name, entityType="person", observations=[about]) for name, about in people.items()
]))
cr.run(cr.Params(relations=[cr.RelationsItem(from_="Ada", to="Charles", relationType="collaborated with")]))

found = sn.run(sn.Params(query="engineer"))   # a typed Result, validated by pydantic
for entity in found.entities:
    print(f"{entity.name} ({entity.entityType}): {'; '.join(entity.observations)}")
for rel in sn.run(sn.Params(query="Ada")).relations:
    print(f"{rel.from_} --{rel.relationType}--> {rel.to}")
