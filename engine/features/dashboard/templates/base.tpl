<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{title}} · aijob</title>
<link rel="icon" href="{{prefix}}/static/icon.svg" type="image/svg+xml">
<link rel="stylesheet" href="{{prefix}}/static/dashboard.css">
<script src="{{prefix}}/static/dashboard.js" defer></script>
</head>
<body>
<header class="top">
  <a class="brand" href="{{prefix}}">aijob</a>
% if defined('user_id'):
  <nav>
    <a href="{{prefix}}" class="{{'on' if title == 'Overview' else ''}}">Overview</a>
    <a href="{{prefix}}/jobs" class="{{'on' if title in ('Jobs', 'Job') else ''}}">Jobs</a>
    <a href="{{prefix}}/usage" class="{{'on' if title == 'Usage' else ''}}">Usage</a>
% for label, href in tabs.items():
    <a href="{{href}}" class="{{'on' if tab == label else ''}}">{{label}}</a>
% end
  </nav>
  <form method="post" action="{{prefix}}/logout" class="signout">
    <span class="who">{{user_id}}</span>
    <input type="hidden" name="csrf" value="{{csrf}}">
    <button type="submit">Sign out</button>
  </form>
% end
</header>
<main>
% if get('notice'):
<p class="notice" role="status">{{notice}}</p>
% end
{{!base}}
</main>
<footer>Times are UTC.</footer>
</body>
</html>
