-- The wrk script of mcp.sh: protected MCP tool calls, each a first call
-- (a new key in params._meta, random at its start as in load.lua), one
-- JSON-RPC tools/call per request, answered as JSON. Its arguments
-- carry the key too: identical calls under new keys while one is in
-- flight would be refused as rotated keys (`rotated_keys = "hold"`, the
-- mcp default), answered 200 with isError and never sent. The environment
-- gives PREFIX. Each run ends with one RESULT line, as load.lua's.
local prefix = os.getenv("PREFIX")
local threads = 0
local counter = 0

function setup(thread)
    thread:set("id", threads)
    threads = threads + 1
end

function init(args)
    math.randomseed(os.time() * 16 + id)
end

local function random_hex()
    return string.format("%04x%04x%04x%04x", math.random(0, 65535), math.random(0, 65535),
        math.random(0, 65535), math.random(0, 65535))
end

request = function()
    counter = counter + 1
    local key = random_hex() .. "-" .. prefix .. "-" .. id .. "-" .. counter
    local body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_task",'
        .. '"arguments":{"title":"bench task ' .. key .. '","amount":1000,"currency":"eur"},'
        .. '"_meta":{"dev.idemgate/idempotency-key":"' .. key .. '"}}}'
    return wrk.format("POST", "/mcp", {
        ["Authorization"] = "Bearer bench",
        ["Content-Type"] = "application/json",
        ["Accept"] = "application/json, text/event-stream",
        ["MCP-Protocol-Version"] = "2025-11-25",
    }, body)
end

done = function(summary, latency, requests)
    local non2xx = summary.errors.status
    local errors = summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.timeout
    io.write(string.format("RESULT %.1f %.3f %.3f %d %d %d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(99) / 1000, non2xx, errors,
        summary.requests))
end
