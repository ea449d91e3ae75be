% rebase('base')
<h1>Overview</h1>
<div data-live="{{refresh_ms}}">
% include('overview_live')
</div>
